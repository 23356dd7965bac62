//! Items this workspace's own crates and tests reach that are not part of the consumer's API: it
//! is public only because those are separate crates, hidden from the documentation, not a
//! stable API, and may change in any release.

pub use crate::cursor::ShownCursor;

/// The acknowledgement statement (a template over `{{schema}}`; `$1` project, `$2` consumer,
/// `$3` lease owner, `$4` generation, `$5` new cursor, `$6` the cursor it replaces): the
/// position write of every delivered batch, whose plan the tests check under a held snapshot.
pub use crate::sql::ACK as ACK_STATEMENT;
/// A consumer set's grouped acknowledgement (a template over `{{schema}}`; `$1` projects, `$2`
/// consumers, `$3` generations, `$4` new cursors, `$5` the set's lease owner, `$6` the cursors
/// they replace), checked by the same tests.
pub use crate::sql::ACK_SET as ACK_SET_STATEMENT;
/// A consumer's lease renewal (a template over `{{schema}}`; `$1` project, `$2` consumer, `$3`
/// lease owner, `$4` generation, `$5` lease seconds), checked by the same tests.
pub use crate::sql::HEARTBEAT as HEARTBEAT_STATEMENT;
/// A consumer set's renewal of every lease it holds (a template over `{{schema}}`; `$1`
/// projects, `$2` consumers, `$3` generations, `$4` the set's lease owner, `$5` lease
/// seconds), checked by the same tests.
pub use crate::sql::HEARTBEAT_SET as HEARTBEAT_SET_STATEMENT;
/// The planner settings a set's grouped statements run under (key scans only), so the tests
/// measure them as they run.
pub use crate::sql::KEY_SCANS_ONLY;
