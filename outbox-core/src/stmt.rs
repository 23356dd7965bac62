//! Statements that survive a transaction-mode pooler.
//!
//! `Client::query(&str, ..)` prepares a *named* statement (`s0`, `s1`, ...) in one round trip
//! and runs it in another. Behind PgBouncer in transaction mode the two round trips of an
//! autocommit statement can land on different server sessions (SQLSTATE 26000, "prepared
//! statement does not exist"), and a statement whose `Close` is sent after its transaction
//! ended (a `Row` keeps its statement alive) stays behind on a server session, where the next
//! client to use that name collides with it (42P05, "already exists").
//!
//! The methods of [`Unnamed`] send every statement as one *unnamed* Parse/Bind/Execute/Sync
//! exchange instead (`query_typed`): one round trip, nothing left on the server, safe on any
//! connection. That needs the parameter types up front; they are learnt once per statement
//! text and process (a `PREPARE` and `DEALLOCATE` in a single simple-protocol message, which
//! a pooler keeps on one server session) and cached. On a direct connection this is also one
//! round trip less than prepare-then-execute.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};

use futures_util::TryStreamExt;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Error, GenericClient, Row, SimpleQueryMessage};

/// Parameter types by statement text, for the whole process. Builtin types have the same OID
/// in every database, and the outbox schema uses no others.
static PARAM_TYPES: OnceLock<Mutex<HashMap<String, Arc<[Type]>>>> = OnceLock::new();

const PROBE: &str = "outbox_param_probe";

/// Unnamed-statement counterparts of `query`, `query_one`, `query_opt` and `execute`, for
/// every `tokio_postgres` client and transaction (and deadpool's wrappers of them).
pub trait Unnamed: GenericClient + Sync {
    /// Like `query`, with an unnamed statement.
    fn query_unnamed(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send;

    /// Like `query_opt`, with an unnamed statement.
    fn query_opt_unnamed(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Option<Row>, Error>> + Send;

    /// Like `query_one`, with an unnamed statement.
    fn query_one_unnamed(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Row, Error>> + Send;

    /// Like `execute`, with an unnamed statement: the number of rows affected.
    fn execute_unnamed(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<u64, Error>> + Send;
}

impl<C: GenericClient + Sync> Unnamed for C {
    async fn query_unnamed(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        let types = param_types(self, sql, params.len()).await?;
        let typed = zip(params, &types);
        self.query_typed(sql, &typed).await
    }

    async fn query_opt_unnamed(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error> {
        let types = param_types(self, sql, params.len()).await?;
        let typed = zip(params, &types);
        self.query_typed_opt(sql, &typed).await
    }

    async fn query_one_unnamed(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error> {
        let types = param_types(self, sql, params.len()).await?;
        let typed = zip(params, &types);
        self.query_typed_one(sql, &typed).await
    }

    async fn execute_unnamed(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        let types = param_types(self, sql, params.len()).await?;
        let typed = zip(params, &types);
        let stream = self.query_typed_raw(sql, typed).await?;
        futures_util::pin_mut!(stream);
        while stream.try_next().await?.is_some() {}
        Ok(stream.rows_affected().unwrap_or(0))
    }
}

fn zip<'a>(
    params: &[&'a (dyn ToSql + Sync)],
    types: &[Type],
) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    // A count mismatch is left for the server to report (as it would for `query`): the
    // missing or extra parameters are sent untyped.
    params
        .iter()
        .enumerate()
        .map(|(i, p)| (*p, types.get(i).cloned().unwrap_or(Type::UNKNOWN)))
        .collect()
}

async fn param_types<C: GenericClient + Sync>(
    client: &C,
    sql: &str,
    count: usize,
) -> Result<Arc<[Type]>, Error> {
    if count == 0 {
        return Ok(Arc::from(Vec::new()));
    }
    let cache = PARAM_TYPES.get_or_init(Default::default);
    if let Some(types) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(sql) {
        return Ok(types.clone());
    }
    // One simple-protocol message: a pooler runs it on one server session, and the
    // DEALLOCATE leaves nothing behind. The statement text is sent as written (no
    // interpolation of values; the statements are the library's own constants).
    let probe = format!(
        "PREPARE {PROBE} AS {sql}\n;\n\
         SELECT parameter_types::oid[]::text FROM pg_prepared_statements WHERE name = '{PROBE}';\n\
         DEALLOCATE {PROBE}"
    );
    let messages = client.simple_query(&probe).await?;
    let text = messages
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_default();
    let types: Arc<[Type]> = text
        .trim_matches(|c| c == '{' || c == '}')
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|oid| {
            oid.parse::<u32>()
                .ok()
                .and_then(Type::from_oid)
                // Not a builtin type: let the server infer it, as it would for `query`.
                .unwrap_or(Type::UNKNOWN)
        })
        .collect();
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(sql.to_owned(), types.clone());
    Ok(types)
}
