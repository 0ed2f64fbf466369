//! Retries for idempotent agent calls on UNAVAILABLE only, with jittered
//! exponential backoff. Every agent RPC is idempotent by contract
//! (agent.proto), so the retry is safe; other codes are answers, not
//! transport trouble, and are returned as they are. No retry starts that
//! would end past the call's deadline: the last error is the better answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::{Code, Status};

use super::call::{AgentCall, Rpc};

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
    /// The last UNAVAILABLE, shared by the clones tower makes, so a caller
    /// that gives up at its deadline can say what went wrong before.
    last_error: Arc<Mutex<Option<String>>>,
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
            last_error: Arc::default(),
        }
    }

    /// The message of the last attempt that met UNAVAILABLE (of this policy
    /// or a clone).
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl<R: Rpc> tower::retry::Policy<AgentCall<R>, R::Reply, Status> for RetryPolicy {
    type Future = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn retry(
        &mut self,
        call: &mut AgentCall<R>,
        result: &mut Result<R::Reply, Status>,
    ) -> Option<Self::Future> {
        // Transport trouble is worth reporting if the call then runs out of
        // time; other answers are returned as they are anyway.
        if let Err(status) = result
            && status.code() == Code::Unavailable
        {
            *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(status.message().to_owned());
        }
        match result {
            Err(status)
                if status.code() == Code::Unavailable && self.attempt + 1 < self.attempts =>
            {
                let delay = self.backoff.delay(self.attempt + 1);
                if tokio::time::Instant::now() + delay >= call.deadline {
                    // A retry would start past the deadline: this error is
                    // the answer.
                    return None;
                }
                self.attempt += 1;
                tracing::debug!(
                    op = R::NAME,
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

    fn clone_request(&mut self, call: &AgentCall<R>) -> Option<AgentCall<R>> {
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

    use csi_scsi_proto::agent::StatusRequest;
    use tower::retry::Policy;

    type StatusReply = csi_scsi_proto::agent::StatusResponse;

    fn status_call(deadline: tokio::time::Instant) -> AgentCall<StatusRequest> {
        AgentCall {
            request: StatusRequest {},
            request_id: "t".into(),
            deadline,
        }
    }

    #[tokio::test]
    async fn no_retry_starts_past_the_deadline_and_the_last_error_is_kept() {
        let ms = Duration::from_millis;
        let backoff = Backoff::try_new(ms(100), ms(100), 0.0).expect("valid");
        let mut policy = RetryPolicy::new(backoff, 5);
        let reader = policy.clone();
        let now = tokio::time::Instant::now();
        let mut unavailable: Result<StatusReply, Status> = Err(Status::unavailable("link down"));
        let mut far = status_call(now + Duration::from_secs(10));
        assert!(
            policy.retry(&mut far, &mut unavailable).is_some(),
            "time for a retry"
        );
        let mut near = status_call(now + ms(50));
        assert!(
            policy.retry(&mut near, &mut unavailable).is_none(),
            "a retry after 100 ms cannot start before a deadline 50 ms away"
        );
        assert_eq!(reader.last_error().as_deref(), Some("link down"));
        let mut refused: Result<StatusReply, Status> = Err(Status::not_found("no such LUN"));
        assert!(
            policy.retry(&mut far, &mut refused).is_none(),
            "an answer is not retried"
        );
        assert_eq!(
            reader.last_error().as_deref(),
            Some("link down"),
            "an answer is not transport trouble"
        );
    }
}
