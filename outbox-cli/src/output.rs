//! The one output path of every command: a result type implements [`Render`] (its table or
//! text form, its JSON document, an optional note for stderr) and [`print()`] writes it as the
//! `--output` flag asks. Also the pieces the table forms share: aligned tables, key/value
//! blocks, and the small formatting rules (times, ages, missing values).

use std::fmt::Display;
use std::io::Write;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::cli::Output;
use crate::failure::Failure;

/// A command's result, printable as a table (or text) and as one JSON document.
pub trait Render {
    /// The human form: a table, key/value lines or a sentence, ending in a newline.
    fn table(&self) -> String;

    /// The machine form, written as one JSON document on one line.
    fn json(&self) -> impl Serialize + '_;

    /// A remark for stderr after the table form (a listing cut short by its limit, say);
    /// never part of stdout.
    fn note(&self) -> Option<String> {
        None
    }
}

/// Writes `value` to stdout in the `output` format (and its note, after a table, to stderr).
pub fn print(output: Output, value: &impl Render) -> Result<(), Failure> {
    match output {
        Output::Json => json(&value.json()),
        Output::Table => {
            emit(&value.table())?;
            if let Some(note) = value.note() {
                eprintln!("note: {note}");
            }
            Ok(())
        }
    }
}

/// The widest a table cell grows: identifiers may be 128 characters and reasons longer, and
/// one such value would otherwise push every other column off the screen. 72 keeps an event ID
/// whole for task IDs of up to 31 characters. The full values are
/// in `--output json`.
pub const MAX_CELL: usize = 72;

/// An aligned, plain-text table: a header row, then one row per item, columns separated by
/// two spaces. Cells are escaped so that stored text can never break the layout or send
/// terminal control sequences, and cut to [`MAX_CELL`] characters (except in a table of fixed
/// widths, whose rows are printed as they arrive: there a longer cell is kept whole and pushes
/// the rest of its row to the right, so an identifier can be copied from it).
#[derive(Debug)]
pub struct Table {
    /// Column names.
    headers: Vec<&'static str>,
    /// Rows of escaped cells, each as long as `headers`.
    rows: Vec<Vec<String>>,
    /// Fixed column widths, for rows printed a few at a time under one header
    /// (`audit --follow`); `None` fits the columns to the rows.
    fixed: Option<Vec<usize>>,
}

impl Table {
    /// An empty table with these columns.
    pub fn new(headers: &[&'static str]) -> Self {
        Self {
            headers: headers.to_vec(),
            rows: Vec::new(),
            fixed: None,
        }
    }

    /// An empty table whose columns have these widths whatever the rows hold (a header or a
    /// cell longer than its column overflows it, whole), so rows rendered later line up with a
    /// header rendered earlier.
    pub fn fixed(headers: &[&'static str], widths: &[usize]) -> Self {
        debug_assert_eq!(headers.len(), widths.len(), "one width per column");
        let widths = headers
            .iter()
            .zip(widths)
            .map(|(h, w)| (*w).max(h.chars().count()))
            .collect();
        Self {
            fixed: Some(widths),
            ..Self::new(headers)
        }
    }

    /// Appends a row; missing cells are blank, extra cells are a bug.
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert!(cells.len() <= self.headers.len(), "more cells than columns");
        let whole = self.fixed.is_some();
        let mut cells: Vec<String> = cells
            .iter()
            .map(|c| match whole {
                true => escape(c),
                false => cut(&escape(c), MAX_CELL),
            })
            .collect();
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// The table as text, one line per row, ending in a newline.
    pub fn render(&self) -> String {
        let widths = self.fixed.clone().unwrap_or_else(|| {
            let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
            for row in &self.rows {
                for (width, cell) in widths.iter_mut().zip(row) {
                    *width = (*width).max(cell.chars().count());
                }
            }
            widths
        });
        let mut out = String::new();
        let header: Vec<String> = self.headers.iter().map(|h| (*h).to_owned()).collect();
        for cells in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (index, (cell, width)) in cells.iter().zip(&widths).enumerate() {
                if index > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                let pad = width.saturating_sub(cell.chars().count());
                line.extend(std::iter::repeat_n(' ', pad));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `text` cut to `width` characters with `…` in the middle, keeping both ends: an event ID's
/// task and time, a consumer ID's prefix and suffix.
pub fn cut(text: &str, width: usize) -> String {
    let length = text.chars().count();
    if length <= width || width < 3 {
        return text.to_owned();
    }
    // The tail gets the larger share: an event ID ends in its 28-character time.
    let tail = (width - 1) * 3 / 5;
    let head = width - 1 - tail;
    let mut out: String = text.chars().take(head).collect();
    out.push('…');
    out.extend(text.chars().skip(length - tail));
    out
}

/// Aligned `key  value` lines, for one object.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (key, value) in pairs {
        out.push_str(&format!("{key:<width$}  {}", escape(value)));
        out.push('\n');
    }
    out
}

/// Replaces control characters with visible escapes (`\n`, `\u{1b}`).
pub fn escape(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The value, or `-` when there is none.
pub fn opt<T: Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// A timestamp to the second, in UTC; `-` when missing.
pub fn time(at: Option<DateTime<Utc>>) -> String {
    opt(at.map(|at| at.format("%Y-%m-%dT%H:%M:%SZ")))
}

/// A duration in seconds as its two largest units (`850ms`, `42s`, `3m05s`, `2h10m`,
/// `4d03h`); `-` when missing.
pub fn age(secs: Option<f64>) -> String {
    let Some(secs) = secs else {
        return "-".to_owned();
    };
    let negative = secs < 0.0;
    let secs = secs.abs();
    let text = if secs < 1.0 {
        format!("{}ms", (secs * 1000.0).round() as u64)
    } else {
        let s = secs.floor() as u64;
        match s {
            0..60 => format!("{s}s"),
            60..3600 => format!("{}m{:02}s", s / 60, s % 60),
            3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
            _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
        }
    };
    if negative { format!("-{text}") } else { text }
}

/// A configured duration the way it is written on the command line: its largest exact unit
/// (`30d`, `12h`, `90m`, `45s`, `250ms`).
pub fn duration(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// Writes `text` to stdout. A closed pipe (`outbox status | head`) is not an error.
pub fn emit(text: &str) -> Result<(), Failure> {
    emit_open(text).map(drop)
}

/// Writes `text` to stdout; false when the reader is gone (a closed pipe: `| head -2` has
/// what it wanted), which is a clean end for a printing command, not a failure.
pub fn emit_open(text: &str) -> Result<bool, Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(Failure::runtime(format!("cannot write to stdout: {e}"))),
    }
}

/// Writes `value` as one JSON document on one line.
pub fn json<T: Serialize>(value: &T) -> Result<(), Failure> {
    let mut text = serde_json::to_string(value)
        .map_err(|e| Failure::runtime(format!("cannot encode the output as JSON: {e}")))?;
    text.push('\n');
    emit(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_escape() {
        let mut table = Table::new(&["ID", "NAME", "NOTE"]);
        table.row(vec!["1".into(), "alpha".into(), "-".into()]);
        table.row(vec!["22".into(), "b\nc".into()]);
        assert_eq!(
            table.render(),
            "ID  NAME   NOTE\n\
             1   alpha  -\n\
             22  b\\nc\n"
        );
        assert_eq!(Table::new(&["A", "B"]).render(), "A  B\n");
    }

    #[test]
    fn long_cells_are_cut_in_the_middle() {
        let long = format!(
            "task-deleted:{}:2026-01-02T03:04:05.000000Z",
            "F".repeat(100)
        );
        let mut table = Table::new(&["EVENT_ID", "N"]);
        table.row(vec![long.clone(), "1".into()]);
        let line = table.render().lines().nth(1).unwrap().to_owned();
        let cell = line.split("  ").next().unwrap();
        assert_eq!(cell.chars().count(), MAX_CELL);
        assert!(cell.starts_with("task-deleted:FFFF"), "{cell}");
        assert_eq!(cell.matches('…').count(), 1, "{cell}");
        assert!(cell.ends_with(":2026-01-02T03:04:05.000000Z"), "{cell}");
        assert_eq!(cut("short", 48), "short");
        assert_eq!(cut("abcdefgh", 5), "ab…gh");
        assert_eq!(cut("abcdefgh", 4), "ab…h");
    }

    #[test]
    fn fixed_tables_line_up_across_renders() {
        let header = Table::fixed(&["ID", "KIND"], &[4, 8]).render();
        let mut later = Table::fixed(&["ID", "KIND"], &[4, 8]);
        later.row(vec!["12345678".into(), "k".into()]);
        later.row(vec!["7".into(), "retired".into()]);
        assert_eq!(header, "ID    KIND\n");
        let rendered = later.render();
        let rows: Vec<&str> = rendered.lines().skip(1).collect();
        assert_eq!(
            rows,
            vec!["12345678  k", "7     retired"],
            "a longer cell is kept whole"
        );
        assert_eq!(
            header.find("KIND"),
            rows[1].find("retired"),
            "each column starts where its header does"
        );
    }

    #[test]
    fn fields_align() {
        assert_eq!(
            fields(&[("state", "dead".into()), ("attempts", "10".into())]),
            "state     dead\nattempts  10\n"
        );
    }

    #[test]
    fn ages_use_two_units() {
        assert_eq!(duration(std::time::Duration::from_secs(30 * 86_400)), "30d");
        assert_eq!(duration(std::time::Duration::from_secs(36 * 3600)), "36h");
        assert_eq!(duration(std::time::Duration::from_secs(90)), "90s");
        assert_eq!(duration(std::time::Duration::from_millis(250)), "250ms");
        assert_eq!(duration(std::time::Duration::ZERO), "0s");
        assert_eq!(age(None), "-");
        assert_eq!(age(Some(0.25)), "250ms");
        assert_eq!(age(Some(42.9)), "42s");
        assert_eq!(age(Some(185.0)), "3m05s");
        assert_eq!(age(Some(7800.0)), "2h10m");
        assert_eq!(age(Some(4.0 * 86_400.0 + 3.0 * 3600.0)), "4d03h");
        assert_eq!(age(Some(-5.0)), "-5s");
    }

    #[test]
    fn escapes_controls_only() {
        assert_eq!(escape("plain ✓"), "plain ✓");
        assert_eq!(escape("a\u{1b}[31m"), "a\\u{1b}[31m");
    }
}
