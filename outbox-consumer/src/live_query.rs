//! The reconciliation live-set query: checked for its shape and for only reading when first
//! prepared, so a wrong query is refused before anything is claimed, and read without
//! trusting its rows.

use outbox_core::error::{describe, is_retryable_db};
use outbox_core::internal::Unnamed as _;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient};

use crate::error::ConsumerError;

/// Column types a task ID may be read from.
const TEXT_TYPES: [Type; 4] = [Type::TEXT, Type::VARCHAR, Type::BPCHAR, Type::NAME];

/// The rule of a live query's parameter, as a query that breaks it is told: checked on its
/// text before it reaches a database ([`text_problem`]) and on its prepared statement
/// ([`check`]).
pub(crate) const ONE_PARAMETER: &str = "it must take exactly one parameter, $1 (the project ID)";

/// What is wrong with a live query's text, before any database sees it: it must name the
/// project as `$1`.
pub(crate) fn text_problem(query: &str) -> Option<&'static str> {
    (!query.contains("$1")).then_some(ONE_PARAMETER)
}

/// The cursor [`check`] declares over the query, never fetched from.
const CHECK_CURSOR: &str = "outbox_live_query_check";

/// What a query that writes is told.
const MUST_ONLY_READ: &str = "a live query must only read: a SELECT (or WITH ... SELECT) \
     without data-modifying statements or FOR UPDATE/SHARE, since reconciliation runs it in a \
     read-only snapshot";

/// Prepares `query` and checks that it takes one text parameter, `$1` (the project ID),
/// returns one text column (task IDs) and only reads. All of it inside one read-only
/// transaction (safe behind a transaction pooler): the query is declared as a cursor there,
/// which starts its plan without fetching a row, and which PostgreSQL refuses for anything
/// but a plain read (a `DELETE ... RETURNING`, a data-modifying `WITH`, a `FOR UPDATE`). A
/// function called by the query that writes is found only when it runs: [`task_ids`] then
/// names it.
pub(crate) async fn check(client: &mut Client, query: &str) -> Result<(), ConsumerError> {
    let tx = client.build_transaction().read_only(true).start().await?;
    let statement = match tx.prepare(query).await {
        Ok(statement) => statement,
        Err(e) if is_retryable_db(&e) => return Err(e.into()),
        Err(e) => {
            return Err(ConsumerError::LiveQueryInvalid(format!(
                "it cannot be prepared: {}",
                describe(&e)
            )));
        }
    };
    let problem = shape_problem(
        statement.params(),
        statement
            .columns()
            .iter()
            .map(|c| (c.name(), c.type_()))
            .collect(),
    );
    if let Some(problem) = problem {
        return Err(ConsumerError::LiveQueryInvalid(problem));
    }
    let declare = format!("DECLARE {CHECK_CURSOR} NO SCROLL CURSOR FOR {query}");
    let parameter = statement.params()[0].clone();
    // Dropping the statement sends its Close; before the rollback, so that behind a
    // transaction pooler it reaches the server session that prepared it.
    drop(statement);
    // `query_typed`: one unnamed statement (a `DECLARE` cannot be `PREPARE`d to learn its
    // parameter types, and the prepared query gave them).
    let problem = match tx.query_typed(&declare, &[(&"", parameter)]).await {
        Ok(_) => None,
        Err(e) => match e.code() {
            // The query itself parsed (it was prepared above): only a SELECT can follow FOR.
            Some(&SqlState::SYNTAX_ERROR) => Some("it is not a SELECT".to_owned()),
            Some(&SqlState::FEATURE_NOT_SUPPORTED) => {
                Some("it writes (a data-modifying statement in WITH)".to_owned())
            }
            // Privileges are checked after the read-only rule: a query refused only for them
            // reads, and a role without them is refused when the query runs, as before (a
            // consumer with a cursor may never reconcile, and need not be granted the table).
            Some(&SqlState::INSUFFICIENT_PRIVILEGE) => None,
            // In this read-only transaction, whatever the server: the query's own doing.
            Some(&SqlState::READ_ONLY_SQL_TRANSACTION) => {
                Some(format!("it writes ({})", describe(&e)))
            }
            _ if is_retryable_db(&e) => return Err(e.into()),
            _ => Some(format!("it does not only read ({})", describe(&e))),
        },
    };
    if let Some(problem) = problem {
        return Err(ConsumerError::LiveQueryInvalid(format!(
            "{problem}; {MUST_ONLY_READ}"
        )));
    }
    tx.rollback().await?;
    Ok(())
}

/// What is wrong with a live query taking `params` and returning `columns`, if anything.
fn shape_problem(params: &[Type], columns: Vec<(&str, &Type)>) -> Option<String> {
    if params.len() != 1 {
        return Some(format!("{ONE_PARAMETER}; it takes {}", params.len()));
    }
    if !TEXT_TYPES.contains(&params[0]) {
        return Some(format!(
            "its parameter $1 is the project ID, a text value, but the query uses it as {}",
            params[0]
        ));
    }
    match columns.as_slice() {
        [(_, ty)] if TEXT_TYPES.contains(ty) => None,
        [(name, ty)] => Some(format!(
            "it must return task IDs as text, but its column {name:?} is {ty} (cast it, e.g. \
             SELECT id::text ...)"
        )),
        _ => Some(format!(
            "it must return exactly one column (task IDs as text); it returns {}",
            columns.len()
        )),
    }
}

/// Runs the live query for `project` in `snapshot`, a read-only transaction; a failure names
/// the live query. A read-only violation there (25006) is the query's own doing (a function
/// it calls writes), never a standby's answer: the transaction is read-only whatever the
/// server, so it is no outage to wait out.
pub(crate) async fn task_ids(
    snapshot: &(impl GenericClient + Sync),
    query: &str,
    project: &str,
) -> Result<Vec<String>, ConsumerError> {
    let rows = match snapshot.query_unnamed(query, &[&project]).await {
        Ok(rows) => rows,
        Err(e) if e.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION) => {
            return Err(ConsumerError::LiveQueryFailed(format!(
                "it tried to write ({}); {MUST_ONLY_READ}",
                describe(&e)
            )));
        }
        Err(e) if is_retryable_db(&e) => return Err(e.into()),
        Err(e) => return Err(ConsumerError::LiveQueryFailed(describe(&e))),
    };
    rows.iter()
        .map(|row| {
            row.try_get::<_, Option<String>>(0)
                .map_err(|e| ConsumerError::LiveQueryFailed(e.to_string()))?
                .ok_or_else(|| ConsumerError::LiveQueryFailed("it returned a NULL task ID".into()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        assert_eq!(
            shape_problem(&[Type::TEXT], vec![("id", &Type::TEXT)]),
            None
        );
        assert_eq!(
            shape_problem(&[Type::VARCHAR], vec![("id", &Type::NAME)]),
            None
        );
        let cases = [
            (
                shape_problem(&[], vec![("id", &Type::TEXT)]),
                "exactly one parameter",
            ),
            (
                shape_problem(&[Type::TEXT, Type::TEXT], vec![("id", &Type::TEXT)]),
                "it takes 2",
            ),
            (
                shape_problem(&[Type::INT4], vec![("id", &Type::TEXT)]),
                "uses it as int4",
            ),
            (
                shape_problem(&[Type::TEXT], vec![("?column?", &Type::INT4)]),
                "is int4",
            ),
            (shape_problem(&[Type::TEXT], vec![]), "returns 0"),
            (
                shape_problem(&[Type::TEXT], vec![("a", &Type::TEXT), ("b", &Type::TEXT)]),
                "returns 2",
            ),
        ];
        for (problem, expected) in cases {
            let problem = problem.expect(expected);
            assert!(problem.contains(expected), "{problem}");
        }
    }

    #[test]
    fn the_text_and_the_prepared_statement_are_held_to_one_rule() {
        assert_eq!(
            text_problem("SELECT id::text FROM tasks"),
            Some(ONE_PARAMETER)
        );
        assert_eq!(text_problem(crate::config::DEFAULT_LIVE_QUERY), None);
        let prepared = shape_problem(&[], vec![("id", &Type::TEXT)]).unwrap();
        assert!(prepared.starts_with(ONE_PARAMETER), "{prepared}");
        let config = crate::config::LiveQuery::Custom("SELECT 1".into());
        assert_eq!(config.problem(), Some(ONE_PARAMETER));
    }
}
