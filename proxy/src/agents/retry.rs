//! Retries for idempotent agent calls on UNAVAILABLE only, with jittered
//! exponential backoff. Every agent RPC is idempotent by contract
//! (agent.proto), so the retry is safe; other codes are answers, not
//! transport trouble, and are returned as they are.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tonic::{Code, Status};

use super::call::{AgentCall, AgentReply};

/// Exponential backoff between `min` and `max`, each delay scaled by a
/// random factor in `[1 - jitter, 1]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    jitter: f64,
}

/// Why a backoff was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid backoff: {0}")]
pub struct InvalidBackoff(&'static str);

/// The tower retry policy: `attempts` tries in all.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    backoff: Backoff,
    attempt: u32,
    attempts: u32,
}

impl Backoff {
    /// Validates `min <= max`, `max > 0` and `0 <= jitter <= 1`.
    pub fn try_new(min: Duration, max: Duration, jitter: f64) -> Result<Self, InvalidBackoff> {
        if max.is_zero() {
            return Err(InvalidBackoff("max must be positive"));
        }
        if min > max {
            return Err(InvalidBackoff("min must not exceed max"));
        }
        if !jitter.is_finite() || !(0.0..=1.0).contains(&jitter) {
            return Err(InvalidBackoff("jitter must be within 0..=1"));
        }
        Ok(Self { min, max, jitter })
    }

    /// The delay before retry number `attempt` (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = self
            .min
            .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1)));
        let base = exp.min(self.max).max(self.min);
        let factor = 1.0 - self.jitter * fastrand::f64();
        base.mul_f64(factor)
            .max(self.min.mul_f64(1.0 - self.jitter))
    }
}

impl RetryPolicy {
    /// At most `attempts` tries (1 = no retry).
    pub fn new(backoff: Backoff, attempts: u32) -> Self {
        Self {
            backoff,
            attempt: 0,
            attempts: attempts.max(1),
        }
    }
}

impl tower::retry::Policy<AgentCall, AgentReply, Status> for RetryPolicy {
    type Future = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn retry(
        &mut self,
        call: &mut AgentCall,
        result: &mut Result<AgentReply, Status>,
    ) -> Option<Self::Future> {
        match result {
            Err(status)
                if status.code() == Code::Unavailable && self.attempt + 1 < self.attempts =>
            {
                self.attempt += 1;
                let delay = self.backoff.delay(self.attempt);
                tracing::debug!(
                    op = call.op.name(),
                    request_id = %call.request_id,
                    attempt = self.attempt,
                    ?delay,
                    error = %status.message(),
                    "agent unavailable; retrying"
                );
                Some(Box::pin(tokio::time::sleep(delay)))
            }
            _ => None,
        }
    }

    fn clone_request(&mut self, call: &AgentCall) -> Option<AgentCall> {
        Some(call.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_backoffs_are_refused() {
        let ms = Duration::from_millis;
        assert!(Backoff::try_new(ms(10), ms(5), 0.1).is_err());
        assert!(Backoff::try_new(ms(0), ms(0), 0.1).is_err());
        assert!(Backoff::try_new(ms(1), ms(5), 1.5).is_err());
        assert!(Backoff::try_new(ms(1), ms(5), f64::NAN).is_err());
    }

    #[test]
    fn every_delay_lies_within_bounds_and_grows() {
        let ms = Duration::from_millis;
        let b = Backoff::try_new(ms(20), ms(500), 0.5).expect("valid");
        for attempt in 1..20 {
            for _ in 0..50 {
                let d = b.delay(attempt);
                assert!(d >= ms(10) && d <= ms(500), "attempt {attempt}: {d:?}");
            }
        }
        let b = Backoff::try_new(ms(20), ms(500), 0.0).expect("valid");
        assert_eq!(b.delay(1), ms(20));
        assert_eq!(b.delay(3), ms(80));
        assert_eq!(b.delay(10), ms(500));
    }
}
