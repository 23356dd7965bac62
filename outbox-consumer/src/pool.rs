//! The connection pool a consumer runs on, built the same way by every program that starts
//! one (the `outbox` CLI, the benchmarks, the tests).

use deadpool_postgres::{BuildError, Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::{Config, NoTls};

/// A pool of at most `size` plain connections to `config`, recycled without a test query
/// (a broken connection shows up as a retryable error at its next use, which the runtime
/// rides out). A consumer needs at least [`MIN_POOL_SIZE`](crate::MIN_POOL_SIZE).
pub fn build_pool(config: Config, size: usize) -> Result<Pool, BuildError> {
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager).max_size(size).build()
}
