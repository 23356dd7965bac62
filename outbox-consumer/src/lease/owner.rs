//! Whether a lease holder is gone: the rule lives in `outbox-core`
//! ([`outbox_core::internal::holder_is_gone`]), beside the owner tokens it reads, because the sequencer
//! lease (`outbox_core::sequencer::ElectedSequencer`) takes over from a holder that is gone by the same
//! rule.

pub(crate) use outbox_core::internal::holder_is_gone;
