//! The reconciliation live-set query: checked for its shape when first prepared, so a wrong
//! query is refused before anything is claimed, and read without trusting its rows.

use outbox_core::{Unnamed as _, describe, is_retryable_db};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient};

use crate::error::ConsumerError;

/// Column types a task ID may be read from.
const TEXT_TYPES: [Type; 4] = [Type::TEXT, Type::VARCHAR, Type::BPCHAR, Type::NAME];

/// Prepares `query` (inside a transaction, so it is safe behind a transaction pooler) and
/// checks that it takes one text parameter, `$1` (the project ID), and returns one text
/// column (task IDs).
pub(crate) async fn check(client: &mut Client, query: &str) -> Result<(), ConsumerError> {
    let tx = client.transaction().await?;
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
    // Dropping the statement sends its Close; before the rollback, so that behind a
    // transaction pooler it reaches the server session that prepared it.
    drop(statement);
    tx.rollback().await?;
    problem.map_or(Ok(()), |problem| {
        Err(ConsumerError::LiveQueryInvalid(problem))
    })
}

/// What is wrong with a live query taking `params` and returning `columns`, if anything.
fn shape_problem(params: &[Type], columns: Vec<(&str, &Type)>) -> Option<String> {
    if params.len() != 1 {
        return Some(format!(
            "it must take exactly one parameter, $1 (the project ID); it takes {}",
            params.len()
        ));
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

/// Runs the live query for `project`; a failure names the live query.
pub(crate) async fn task_ids(
    client: &(impl GenericClient + Sync),
    query: &str,
    project: &str,
) -> Result<Vec<String>, ConsumerError> {
    let rows = match client.query_unnamed(query, &[&project]).await {
        Ok(rows) => rows,
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
}
