//! One backoff for every wait that grows while something keeps failing:
//! a [`Backoff`] is a plain value — how many attempts go again at once,
//! the first wait, the factor, the cap and the jitter — and
//! [`Backoff::delay`] turns an attempt number and a jitter sample into a
//! wait. Pure: the caller draws the sample (uniform in [0, 1)) where
//! randomness is allowed, so every ladder is deterministic in a test.
//! A fixed interval is the degenerate ladder: factor 1, no jitter.
//!
//! Every ladder of the system, with its parameters and why, is named in
//! [`ladders`].

pub mod ladders;

use std::time::Duration;

/// How a ladder spreads its waits so that clients refused together do not
/// come back together: each wait is its step times a factor drawn
/// uniformly from `[low, low + width)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Jitter {
    pub low: f64,
    pub width: f64,
}

impl Jitter {
    /// Every wait is its step.
    pub const NONE: Self = Self { low: 1.0, width: 0.0 };
    /// `[step, 2·step)`: never sooner than the step.
    pub const UP_TO_DOUBLE: Self = Self { low: 1.0, width: 1.0 };
    /// `[step/2, step)`: never later than the step.
    pub const LOWER_HALF: Self = Self { low: 0.5, width: 0.5 };
    /// `[0.8·step, 1.2·step)`: ±20 % around the step.
    pub const PLUS_MINUS_20_PERCENT: Self = Self { low: 0.8, width: 0.4 };
}

/// A ladder of waits: `immediate` attempts go again at once, then the
/// waits start at `first` and grow `factor` times each attempt, never
/// stepping past `cap`; each is spread by `jitter`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// Attempts (counted from 0) that go again without a wait.
    pub immediate: u32,
    /// The first wait after the immediate attempts.
    pub first: Duration,
    /// Each step is this many times the one before: 1 is a fixed interval.
    pub factor: u32,
    /// The longest step (before jitter).
    pub cap: Duration,
    pub jitter: Jitter,
}

impl Backoff {
    /// The same wait every time.
    pub const fn fixed(every: Duration) -> Self {
        Self {
            immediate: 0,
            first: every,
            factor: 1,
            cap: every,
            jitter: Jitter::NONE,
        }
    }

    /// The wait after attempt `attempt` (counted from 0), before jitter:
    /// the whole wait of a ladder without jitter.
    pub fn step(&self, attempt: u32) -> Duration {
        let Some(climbed) = attempt.checked_sub(self.immediate) else {
            return Duration::ZERO;
        };
        self.first
            .saturating_mul(self.factor.saturating_pow(climbed))
            .min(self.cap)
    }

    /// The wait after attempt `attempt`, spread by `sample`, a draw
    /// uniform in [0, 1) (clamped to it).
    pub fn delay(&self, attempt: u32, sample: f64) -> Duration {
        let step = self.step(attempt);
        if self.jitter == Jitter::NONE {
            return step;
        }
        step.mul_f64(self.jitter.low + self.jitter.width * sample.clamp(0.0, 1.0))
    }
}

/// The attempts of one ladder so far: what a retry loop keeps between its
/// failures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attempts(u32);

impl Attempts {
    /// The wait before the next attempt, spread by `sample`; counts one more.
    pub fn next_delay(&mut self, ladder: &Backoff, sample: f64) -> Duration {
        let wait = ladder.delay(self.0, sample);
        self.0 = self.0.saturating_add(1);
        wait
    }

    /// [`Self::next_delay`] for a ladder without jitter.
    pub fn next_step(&mut self, ladder: &Backoff) -> Duration {
        let wait = ladder.step(self.0);
        self.0 = self.0.saturating_add(1);
        wait
    }

    /// Success: the next failure starts from the bottom of the ladder.
    pub fn reset(&mut self) {
        self.0 = 0;
    }

    /// Failures counted since the last reset.
    pub fn count(self) -> u32 {
        self.0
    }
}

#[cfg(test)]
mod tests;
