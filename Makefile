# lifecycle-outbox: the two commands of the README, and a few helpers.
.PHONY: demo test bench lint pg-up pg-down build docs

# Starts a disposable PostgreSQL, migrates, and runs a narrated scenario.
demo:
	bash scripts/demo.sh

# Everything the suite needs (a fresh disposable cluster), then lint and the whole suite.
test:
	bash scripts/test.sh

# The docs book (docs/) into docs/book/: mdBook (installed the first time, see scripts/mdbook.sh) with
# warnings as errors, then its checks: no dead relative link, the CLI reference current.
docs:
	bash scripts/mdbook.sh check

# Benchmarks; figures go to stdout and bench/RESULTS*.md.
bench:
	bash bench/run.sh

# Formatting, clippy, no library file over 600 lines, and the dependency policy in deny.toml
# (cargo-deny, installed the first time, see scripts/deny.sh; the advisory database is fetched).
lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	bash scripts/file-length.sh
	bash scripts/deny.sh check

build:
	cargo build --workspace

pg-up:
	@bash scripts/pg.sh up

pg-down:
	bash scripts/pg.sh down
