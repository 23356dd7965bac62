//! Durations as log lines show them: `91.2ms`, `1.5s`, `2m 30s`, with the precision a reader
//! needs, instead of `Debug`'s `91.245485ms` or every unit down to nanoseconds
//! (`91ms 245us 485ns`). Log fields that hold a duration use [`Readable`].

use std::fmt;
use std::time::Duration;

/// A duration displayed for people: three significant figures below a minute (`250us`,
/// `91.2ms`, `1.5s`, `30s`), then whole units (`2m 30s`, `1h 5m`, `2d 3h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readable(pub Duration);

impl fmt::Display for Readable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        let nanos = d.as_nanos();
        // One decimal below 100 of a unit, none above: at most three significant figures.
        let scaled = |value: f64, unit: &str| -> String {
            let text = if value < 100.0 {
                format!("{value:.1}")
            } else {
                format!("{value:.0}")
            };
            let text = text.strip_suffix(".0").unwrap_or(&text);
            format!("{text}{unit}")
        };
        let text = if nanos < 1_000 {
            format!("{nanos}ns")
        } else if nanos < 1_000_000 {
            scaled(nanos as f64 / 1e3, "us")
        } else if nanos < 1_000_000_000 {
            scaled(nanos as f64 / 1e6, "ms")
        } else if d < Duration::from_secs(60) {
            scaled(d.as_secs_f64(), "s")
        } else {
            let secs = d.as_secs();
            let (big, small, units) = if secs < 3_600 {
                (secs / 60, secs % 60, ("m", "s"))
            } else if secs < 86_400 {
                (secs / 3_600, secs % 3_600 / 60, ("h", "m"))
            } else {
                (secs / 86_400, secs % 86_400 / 3_600, ("d", "h"))
            };
            match small {
                0 => format!("{big}{}", units.0),
                _ => format!("{big}{} {small}{}", units.0, units.1),
            }
        };
        f.pad(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        let show = |d: Duration| Readable(d).to_string();
        assert_eq!(show(Duration::ZERO), "0ns");
        assert_eq!(show(Duration::from_nanos(91_245_485)), "91.2ms");
        assert_eq!(show(Duration::from_millis(500)), "500ms");
        assert_eq!(show(Duration::from_micros(250)), "250us");
        assert_eq!(show(Duration::from_micros(1_500)), "1.5ms");
        assert_eq!(show(Duration::from_millis(1_500)), "1.5s");
        assert_eq!(show(Duration::from_secs(30)), "30s");
        assert_eq!(show(Duration::from_millis(59_990)), "60s");
        assert_eq!(show(Duration::from_secs(150)), "2m 30s");
        assert_eq!(show(Duration::from_secs(300)), "5m");
        assert_eq!(show(Duration::from_secs(3_900)), "1h 5m");
        assert_eq!(show(Duration::from_secs(2 * 86_400 + 3 * 3_600)), "2d 3h");
    }
}
