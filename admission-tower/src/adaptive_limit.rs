//! `Adaptive`: an adaptive count limit, and where its samples end.

use admission_core::adaptive::AdaptiveBuilder;

/// An adaptive count limit for [`AdmissionBuilder::adaptive`](crate::AdmissionBuilder::adaptive):
/// the core's [`AdaptiveLimit`](crate::adaptive::AdaptiveLimit) builder, and where a
/// request's latency sample ends. An `AdaptiveBuilder` converts into one (samples end at
/// the response head).
///
/// ```
/// use admission_tower::adaptive::{AdaptiveLimit, Gradient};
/// use admission_tower::{Adaptive, AdmissionLayer, SampleAt};
///
/// let limit = AdaptiveLimit::builder(Gradient::default()).bounds(8, 2_000).initial(32);
/// let layer = AdmissionLayer::builder()
///     .adaptive(Adaptive::new(limit).sample_at(SampleAt::BodyEnd))
///     .build()?;
/// assert_eq!(layer.snapshot().adaptive.unwrap().limit, 32);
/// # Ok::<(), admission_tower::BuildError>(())
/// ```
#[derive(Debug)]
pub struct Adaptive {
    pub(crate) limit: AdaptiveBuilder,
    pub(crate) sample_at: SampleAt,
}

impl Adaptive {
    /// The limit `limit` builds, sampled at the response head.
    pub fn new(limit: AdaptiveBuilder) -> Self {
        Self {
            limit,
            sample_at: SampleAt::default(),
        }
    }

    /// Where each request's latency sample ends (default: the response head).
    pub fn sample_at(mut self, at: SampleAt) -> Self {
        self.sample_at = at;
        self
    }
}

impl From<AdaptiveBuilder> for Adaptive {
    fn from(limit: AdaptiveBuilder) -> Self {
        Self::new(limit)
    }
}

/// Where an adaptive limit's latency sample of a request ends ([`Adaptive::sample_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SampleAt {
    /// When the inner service answers with the response head (the default). The time
    /// the service took to decide, whatever the body does next: a streaming response
    /// (server-sent events, a gRPC server stream, a download to a slow client) would
    /// otherwise read as a server slowing down. The permit is still held until the body
    /// ends.
    #[default]
    Head,
    /// When the response body ends (or fails, or is dropped) and the permit is released:
    /// the whole time the request held its place. For services whose work is in the
    /// body (a handler that streams a computed result) and whose bodies are short.
    BodyEnd,
}
