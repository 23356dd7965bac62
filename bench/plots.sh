#!/usr/bin/env bash
# The docs book's benchmark plots, drawn from the committed results files: the figures people
# compare, throughput and latency against peers and floors, as SVG bar charts under
# docs/src/benchmarks/plots/ (shown on the book's Benchmarks page).
#
#   bash bench/plots.sh           redraw the plots from bench/RESULTS-*.md
#   bash bench/plots.sh --check   fail when a committed plot is not what the results files give
#                                 (`make docs` and `make test` run this)
#
# Only bash and awk: no plotting package to install. Run it after a benchmark rewrites its
# results file, and commit the plots with it.
set -euo pipefail
cd "$(dirname "$0")/.."

out_dir=docs/src/benchmarks/plots
check=false
[ "${1:-}" = --check ] && check=true

# The table rows (`| ... |`, header and rule excluded) of the section under HEADING of FILE.
rows() {
    awk -v h="$2" '
        $0 == h { on = 1; next }
        on && /^#/ { exit }
        on && /^\|/ { n++; if (n > 2) print }
    ' "$1"
}

# Field N (1-based, trimmed) of a table row.
cell() {
    awk -F'|' -v n="$1" '{ v = $(n + 1); gsub(/^[ \t]+|[ \t]+$/, "", v); gsub(/[`*]/, "", v); print v }'
}

# The median of the numbers on stdin.
median() {
    sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# A horizontal bar chart: stdin holds `label<TAB>value<TAB>kind` lines (kind `ours`, `peer`
# or `floor` picks the colour); TITLE, UNIT and SOURCE label it.
chart() {
    awk -F'\t' -v title="$1" -v unit="$2" -v source="$3" '
        function esc(s) { gsub(/&/, "\\&amp;", s); gsub(/</, "\\&lt;", s); gsub(/>/, "\\&gt;", s); return s }
        { label[NR] = $1; value[NR] = $2 + 0; kind[NR] = $3; if (value[NR] > max) max = value[NR] }
        END {
            bar = 22; gap = 8; left = 290; width = 420; top = 48
            height = top + NR * (bar + gap) + 40
            colour["ours"] = "#2b6cb0"; colour["peer"] = "#dd6b20"; colour["floor"] = "#718096"
            printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"13\">\n", left + width + 120, height
            printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            printf "<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">%s</text>\n", esc(title)
            for (i = 1; i <= NR; i++) {
                y = top + (i - 1) * (bar + gap)
                w = (max > 0) ? value[i] / max * width : 0
                printf "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n", left - 8, y + 16, esc(label[i])
                printf "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"/>\n", left, y, w, bar, colour[kind[i]]
                printf "<text x=\"%.1f\" y=\"%d\">%s %s</text>\n", left + w + 6, y + 16, value[i], esc(unit)
            }
            printf "<text x=\"10\" y=\"%d\" fill=\"#4a5568\">blue: lifecycle-outbox; orange: a peer; grey: a floor. From %s</text>\n", height - 14, esc(source)
            printf "</svg>\n"
        }
    '
}

draw_writer() {
    local clients variant tps kind name
    for clients in 8 32; do
        rows bench/RESULTS-peers.md "### $clients clients" | while IFS= read -r row; do
            variant=$(cell 1 <<<"$row")
            tps=$(cell 2 <<<"$row")
            # The results file's variant names, as the plot says them.
            case "$variant" in
                bare) kind=floor name="bare soft delete" ;;
                floor) kind=floor name="one-insert floor" ;;
                pgq) kind=peer name="PgQ insert_event" ;;
                rust) kind=ours name="Rust writer" ;;
                rust+seq) kind=ours name="Rust writer + sequencer" ;;
                ours) kind=ours name="SQL writer" ;;
                ours+seq) kind=ours name="SQL writer + sequencer" ;;
                *) continue ;;
            esac
            printf '%s clients: %s\t%s\t%s\n' "$clients" "$name" "$tps" "$kind"
        done
    done | chart "Writer throughput against PgQ and the floors" "TPS" "bench/RESULTS-peers.md"
}

draw_catch_up() {
    local ours pgq runtime bare
    ours=$(rows bench/RESULTS-peers.md "## Drain (catch-up)" | grep -F 'ours' | cell 2)
    pgq=$(rows bench/RESULTS-peers.md "## Drain (catch-up)" | grep -F 'PgQ' | cell 2)
    runtime=$(rows bench/RESULTS-consumer.md "## Catch-up" | grep -F '| catch-up ' | cell 3 | median)
    bare=$(rows bench/RESULTS-consumer.md "## Catch-up" | grep -F '| bare loop ' | cell 3 | median)
    printf '%s\t%s\t%s\n' \
        "consumer runtime (peers run)" "$ours" ours \
        "PgQ batch API (peers run)" "$pgq" peer \
        "consumer runtime (consumer run)" "$runtime" ours \
        "bare read-and-ack loop" "$bare" floor |
        chart "Catch-up of a 1M-event backlog (medians)" "events/s" \
            "bench/RESULTS-peers.md, bench/RESULTS-consumer.md"
}

draw_latency() {
    local row rate p50 p99
    rows bench/RESULTS-consumer.md "## End-to-end latency (writer commit to handler)" |
        grep -F '| LISTEN |' | while IFS= read -r row; do
            rate=$(cell 2 <<<"$row")
            p50=$(cell 5 <<<"$row")
            p99=$(cell 6 <<<"$row")
            printf '%s events/s: p50\t%s\tours\n%s events/s: p99\t%s\tours\n' "$rate" "$p50" "$rate" "$p99"
        done | chart "Writer commit to handler, with LISTEN" "ms" "bench/RESULTS-consumer.md"
}

status=0
mkdir -p "$out_dir"
for plot in writer catch_up latency; do
    file="$out_dir/${plot//_/-}.svg"
    svg=$("draw_$plot")
    if ! grep -q '<rect x=' <<<"$svg"; then
        echo "plots.sh: no figures found for $file (has its results file changed shape?)" >&2
        exit 1
    fi
    if $check; then
        if [ "$svg" != "$(cat "$file" 2>/dev/null)" ]; then
            echo "plots.sh: $file is not what the results files give; run: bash bench/plots.sh" >&2
            status=1
        fi
    else
        printf '%s\n' "$svg" >"$file"
        echo "plots.sh: wrote $file" >&2
    fi
done
exit $status
