//! A progress line for long operator commands (`prune` over millions of events), drawn on
//! stderr in the manner of indicatif: a spinner, the elapsed time and what the command says
//! about itself, redrawn in place at most ten times a second and erased at the end. Only on
//! a terminal, and never with `--output json` (a script reads that output, and a terminal
//! running the script need not see the line either).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::cli::Output;

/// The spinner's frames, one per redraw.
const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// How often the line is redrawn at most.
const REDRAW: Duration = Duration::from_millis(100);

/// One progress line on stderr.
pub struct Progress {
    /// Whether to draw at all.
    enabled: bool,
    /// When the command started, for the elapsed time and rates.
    started: Instant,
    /// When the line was last drawn.
    last: Option<Instant>,
    /// Redraws so far (the spinner's frame).
    frame: usize,
}

impl Progress {
    /// A line drawn only when stderr is a terminal and the output is not JSON.
    pub fn new(output: Output) -> Self {
        Self::enabled_if(output == Output::Table && std::io::stderr().is_terminal())
    }

    /// A line drawn only when `enabled`.
    fn enabled_if(enabled: bool) -> Self {
        Self {
            enabled,
            started: Instant::now(),
            last: None,
            frame: 0,
        }
    }

    /// How long the command has run.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// `count` per second since the start, as text (`12.3k/s`), for a figure of the line.
    pub fn rate(&self, count: u64) -> String {
        let secs = self.elapsed().as_secs_f64().max(0.001);
        let per_sec = count as f64 / secs;
        if per_sec >= 1000.0 {
            format!("{:.1}k/s", per_sec / 1000.0)
        } else {
            format!("{per_sec:.0}/s")
        }
    }

    /// Redraws the line with `text` (built by `text` only when it is drawn), at most every
    /// 100 ms.
    pub fn draw(&mut self, text: impl FnOnce(&Self) -> String) {
        if !self.enabled || self.last.is_some_and(|t| t.elapsed() < REDRAW) {
            return;
        }
        self.last = Some(Instant::now());
        let line = self.line(&text(self));
        self.frame += 1;
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}").and_then(|()| err.flush());
    }

    /// The line as drawn: spinner, elapsed time, text.
    fn line(&self, text: &str) -> String {
        let secs = self.elapsed().as_secs();
        format!(
            "{} [{:02}:{:02}:{:02}] {text}",
            FRAMES[self.frame % FRAMES.len()],
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        )
    }

    /// Erases the line, if one was drawn.
    pub fn clear(&self) {
        if self.enabled && self.last.is_some() {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K").and_then(|()| err.flush());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_has_a_spinner_the_elapsed_time_and_the_text() {
        let progress = Progress::enabled_if(true);
        let line = progress.line("pruning: 10 event(s)");
        assert!(line.starts_with('⠋'), "{line}");
        assert!(line.ends_with("] pruning: 10 event(s)"), "{line}");
        assert!(line.contains("[00:00:0"), "{line}");
        assert!(progress.rate(0).ends_with("/s"));
    }

    #[test]
    fn nothing_is_drawn_when_disabled() {
        let mut progress = Progress::enabled_if(false);
        progress.draw(|_| unreachable!("the text is not built"));
        assert!(progress.last.is_none());
    }
}
