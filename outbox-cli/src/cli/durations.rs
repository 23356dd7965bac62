//! The duration flags: how a duration is typed and shown, and the one range rule every
//! duration flag parses with.

use std::time::Duration;

/// A duration as a person types it on the command line, and as the flags parse it back:
/// `500ms`, `2500ms`, `10s`, `1m`, `1h 30m`.
pub fn human(d: Duration) -> String {
    if d.subsec_nanos() == 0 || d >= Duration::from_secs(60) {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    } else if d.subsec_nanos() % 1_000_000 == 0 {
        format!("{}ms", d.as_millis())
    } else {
        humantime::format_duration(d).to_string()
    }
}

/// The rule of every duration flag, shown after the options of the commands that take them.
pub const DURATIONS_HELP: &str = "Durations are a number and a unit (250ms, 10s, 5m, 2h, 7d), \
greater than zero and at most 24h; a retention period (--retention, --max-retention-overrun) \
is 0s to 36500 days, --max-tick-pause 0s to 100ms, and --give-up-after at most 36500 days. \
Anything else, a negative value included, is refused with exit 2 naming the range.";

/// The longest time knob a running process takes (a lease, a retry delay, an interval, a
/// threshold): past a day a value is a typo (`1y` for `1s`), and every such value must also fit
/// PostgreSQL's interval arithmetic.
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The longest retention-like period (a stream's maximum age): 36500 days.
pub const MAX_LONG_DURATION: std::time::Duration = std::time::Duration::from_secs(36_500 * 86_400);

/// Parses a human duration ("250ms", "10s", "5m"): greater than zero, at most 24h.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    parse_bounded(text, MAX_DURATION, "24h")
}

/// Parses a long period ("7d", "90d"): greater than zero, at most 36500 days.
pub fn parse_long_duration(text: &str) -> Result<std::time::Duration, String> {
    parse_bounded(text, MAX_LONG_DURATION, "36500 days")
}

/// One rule for every duration flag: a range error names the range, for a negative value too
/// (humantime would report an unexpected character at position 0).
fn parse_bounded(
    text: &str,
    max: std::time::Duration,
    max_text: &str,
) -> Result<std::time::Duration, String> {
    let trimmed = text.trim();
    if let Some(magnitude) = trimmed.strip_prefix('-') {
        if humantime::parse_duration(magnitude.trim()).is_ok() {
            return Err(format!(
                "invalid duration {text:?}: must be greater than zero and at most {max_text}"
            ));
        }
    }
    let d = humantime::parse_duration(trimmed)
        .map_err(|e| format!("invalid duration {text:?}: {e} (examples: 250ms, 10s, 5m)"))?;
    if d.is_zero() {
        return Err(format!(
            "invalid duration {text:?}: must be greater than zero"
        ));
    }
    if d > max {
        return Err(format!("invalid duration {text:?}: at most {max_text}"));
    }
    Ok(d)
}

/// Parses a retention period ("30d", "12h", "0s"); zero is allowed, more than 36500 days not.
pub fn parse_retention(text: &str) -> Result<Duration, String> {
    if text.trim().starts_with('-') {
        return Err(format!(
            "invalid duration {text:?}: must be between 0s and 36500 days"
        ));
    }
    let d = humantime::parse_duration(text)
        .map_err(|e| format!("invalid duration {text:?}: {e} (examples: 30d, 12h, 0s)"))?;
    if d > outbox_core::retention::MAX_RETENTION {
        return Err(format!("invalid duration {text:?}: at most 36500 days"));
    }
    Ok(d)
}

/// Parses a pause of the sequencer after a busy tick (`--max-tick-pause`, `--min-tick-pause`):
/// 0s to 100ms.
pub fn parse_tick_pause(text: &str) -> Result<Duration, String> {
    parse_up_to(
        text,
        outbox_core::sequencer::MAX_TICK_PAUSE_LIMIT,
        "0s, 500us, 2ms",
    )
}

/// Parses a duration from zero (inclusive) to `max`, named in the refusal with `examples`.
pub fn parse_up_to(text: &str, max: Duration, examples: &str) -> Result<Duration, String> {
    let range = format!("must be between 0s and {}", human(max));
    if text.trim().starts_with('-') {
        return Err(format!("invalid duration {text:?}: {range}"));
    }
    let d = humantime::parse_duration(text.trim())
        .map_err(|e| format!("invalid duration {text:?}: {e} (examples: {examples})"))?;
    if d > max {
        return Err(format!("invalid duration {text:?}: {range}"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_pauses_are_zero_to_a_tenth_of_a_second() {
        assert_eq!(parse_tick_pause("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_tick_pause("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_tick_pause("100ms"), Ok(Duration::from_millis(100)));
        for bad in ["101ms", "1s", "-1ms", "soon", ""] {
            let refused = parse_tick_pause(bad).unwrap_err();
            assert!(refused.contains(&format!("{bad:?}")), "{refused}");
        }
        assert!(
            parse_tick_pause("-2ms")
                .unwrap_err()
                .contains("between 0s and 100ms")
        );
    }
}
