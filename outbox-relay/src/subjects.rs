//! Where the relay publishes: the subject prefix and stream name as the operator gives them,
//! each event type's subject of a project, the reconciliation subject, and whether a stream's
//! subjects cover them. Pure functions, so every refusal has a unit test and a message naming
//! the problem.

/// Checks `--subject-prefix`: one or more dot-separated NATS tokens without wildcards. The
/// relay publishes to `<prefix>.<project>.<type token>` and its stream covers `<prefix>.>`;
/// an empty prefix would claim every subject, a wildcard would make the subjects unpublishable.
pub fn validate_subject_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Err("invalid --subject-prefix: must not be empty".into());
    }
    if let Some(c) = prefix.chars().find(|c| matches!(c, '*' | '>')) {
        return Err(format!(
            "invalid --subject-prefix {prefix:?}: wildcard {c:?} is not allowed"
        ));
    }
    if let Some(c) = prefix.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "invalid --subject-prefix {prefix:?}: character {c:?} is not allowed"
        ));
    }
    if prefix.split('.').any(str::is_empty) {
        return Err(format!(
            "invalid --subject-prefix {prefix:?}: empty token (leading, trailing or double dot)"
        ));
    }
    Ok(())
}

/// Checks `--stream`: JetStream refuses names with whitespace, `.`, `*`, `>`, `/` or `\`.
pub fn validate_stream_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("invalid --stream: must not be empty".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        return Err(format!(
            "invalid --stream {name:?}: character {c:?} is not allowed in a stream name"
        ));
    }
    if name.len() > 255 {
        return Err(format!(
            "invalid --stream: {} characters, at most 255",
            name.len()
        ));
    }
    Ok(())
}

/// The project's subject token: the project ID with every `.` written `%2E`, so that it is
/// always exactly one NATS token (`acme.eu` → `acme%2Eeu`; otherwise it would be two, and
/// `<prefix>.*.task_deleted` would miss it while `<prefix>.acme.>` caught it). Project IDs
/// cannot contain `%` (nor `*`, `>` or whitespace), so replacing `%2E` by `.` gives the ID
/// back, and an ID without a dot is its own token.
pub(crate) fn project_token(project: &str) -> String {
    project.replace('.', "%2E")
}

/// The subjects of one project: `<prefix>.<token>`, under which its events and reconciliation
/// notices go; what a stream of the stream fence covers (`<prefix>.<token>.>`), so each project
/// has a stream to itself.
pub fn project_prefix(prefix: &str, project: &str) -> String {
    format!("{prefix}.{}", project_token(project))
}

/// The subject of a project's events of `event_type`: `<prefix>.<project>.<type token>`
/// (`task:archived` → `task_archived`; `task:deleted` → `task_deleted`, the one subject of the
/// relay before there were other types). The token is [`outbox_core::contract::subject_token`],
/// the rule the AsyncAPI document's channels follow too.
pub fn event_subject(prefix: &str, project: &str, event_type: &str) -> String {
    format!(
        "{prefix}.{}.{}",
        project_token(project),
        outbox_core::contract::subject_token(event_type)
    )
}

/// The subjects of the types a consumer declares, one per type (its majors share it), in
/// declaration order. Refused when two declared types share a token (`a_b:c` and `a:b_c`):
/// their events would be one subject, and a downstream filter could not tell them apart.
pub fn event_subjects(
    prefix: &str,
    project: &str,
    types: &outbox_core::contract::EventTypes,
) -> Result<Vec<(String, String)>, String> {
    let mut subjects: Vec<(String, String)> = Vec::new();
    for reference in types.refs() {
        let event_type = reference.event_type.as_str();
        let subject = event_subject(prefix, project, event_type);
        match subjects.iter().find(|(_, known)| *known == subject) {
            Some((other, _)) if other == event_type => {}
            Some((other, _)) => {
                return Err(format!(
                    "invalid --event-types: {other} and {event_type} would both be relayed to \
                     {subject} (one subject token per type); relay them with two relays, each \
                     declaring one of them"
                ));
            }
            None => subjects.push((event_type.to_owned(), subject)),
        }
    }
    Ok(subjects)
}

/// The subject of each type a relay declares, looked up per event.
#[derive(Debug, Clone)]
pub(crate) struct EventSubjects {
    prefix: String,
    project: String,
    /// Each declared type and its subject, in declaration order.
    by_type: Vec<(String, String)>,
}

impl EventSubjects {
    /// The subjects of `types` (a type's majors share one).
    pub(crate) fn new(
        prefix: &str,
        project: &str,
        types: &outbox_core::contract::EventTypes,
    ) -> Self {
        let mut by_type: Vec<(String, String)> = Vec::new();
        for reference in types.refs() {
            let event_type = reference.event_type.as_str();
            if !by_type.iter().any(|(known, _)| known == event_type) {
                by_type.push((
                    event_type.to_owned(),
                    event_subject(prefix, project, event_type),
                ));
            }
        }
        Self {
            prefix: prefix.to_owned(),
            project: project.to_owned(),
            by_type,
        }
    }

    /// The subject of an event of `event_type`; a type not declared here (a consumer
    /// configured apart from the relay's settings) follows the same rule.
    pub(crate) fn of(&self, event_type: &str) -> String {
        match self.by_type.iter().find(|(known, _)| known == event_type) {
            Some((_, subject)) => subject.clone(),
            None => event_subject(&self.prefix, &self.project, event_type),
        }
    }

    /// The declared types' subjects.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> {
        self.by_type.iter().map(|(_, subject)| subject.as_str())
    }
}

/// Whether `subject` (one of a project's, see [`project_prefix`]) carries reconciliation
/// notices rather than events: an event type's token always holds a `_`, `reconcile` none.
pub(crate) fn is_reconcile_subject(subject: &str) -> bool {
    subject.ends_with(".reconcile")
}

/// The subject of a project's reconciliation notices.
pub(crate) fn reconcile_subject(prefix: &str, project: &str) -> String {
    format!("{prefix}.{}.reconcile", project_token(project))
}

/// Whether the stream subject `pattern` matches every subject under `<prefix>.>`: token by
/// token, a literal must equal the prefix's token and `>` covers the rest; `*` covers one
/// token but can never cover the open-ended tail.
pub(crate) fn covers(pattern: &str, prefix: &str) -> bool {
    let mut want = prefix.split('.');
    for token in pattern.split('.') {
        match token {
            ">" => return true,
            "*" => {
                if want.next().is_none() {
                    return false;
                }
            }
            literal => {
                if want.next() != Some(literal) {
                    return false;
                }
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        for good in ["lifecycle", "acme.lifecycle", "a-b_c"] {
            validate_subject_prefix(good).unwrap();
        }
        for (bad, says) in [
            ("", "must not be empty"),
            ("life.*", "wildcard '*'"),
            ("life.>", "wildcard '>'"),
            ("a b", "character ' '"),
            (".a", "empty token"),
            ("a.", "empty token"),
            ("a..b", "empty token"),
        ] {
            let err = validate_subject_prefix(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn stream_names() {
        validate_stream_name("LIFECYCLE").unwrap();
        for bad in ["", "A.B", "A B", "A*", "A>", "a/b"] {
            assert!(validate_stream_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn coverage() {
        assert!(covers("lifecycle.>", "lifecycle"));
        assert!(covers(">", "lifecycle"));
        assert!(covers("acme.>", "acme.lifecycle"));
        assert!(covers("*.>", "lifecycle"));
        assert!(covers("acme.*.>", "acme.lifecycle"));
        assert!(!covers("lifecycle.*", "lifecycle"));
        assert!(!covers("lifecycle.*.task_deleted", "lifecycle"));
        assert!(!covers("other.>", "lifecycle"));
        assert!(!covers("lifecycle", "lifecycle"));
        assert!(!covers("acme.lifecycle.p1.>", "acme.lifecycle"));
    }

    #[test]
    fn subjects() {
        assert_eq!(
            event_subject("lifecycle", "p1", "task:deleted"),
            "lifecycle.p1.task_deleted"
        );
        assert_eq!(
            event_subject("lifecycle", "p1", "task:archived"),
            "lifecycle.p1.task_archived"
        );
        assert!(!is_reconcile_subject("lifecycle.p1.task_archived"));
        assert!(is_reconcile_subject(&reconcile_subject("lifecycle", "p1")));
        assert_eq!(
            reconcile_subject("lifecycle", "p1"),
            "lifecycle.p1.reconcile"
        );
    }

    #[test]
    fn each_declared_type_has_a_subject_of_its_own() {
        let types: outbox_core::contract::EventTypes =
            "task:deleted@1,task:archived@1,task:archived@2"
                .parse()
                .unwrap();
        assert_eq!(
            event_subjects("lifecycle", "p1", &types).unwrap(),
            vec![
                (
                    "task:deleted".to_owned(),
                    "lifecycle.p1.task_deleted".to_owned()
                ),
                (
                    "task:archived".to_owned(),
                    "lifecycle.p1.task_archived".to_owned()
                ),
            ]
        );
        let clash: outbox_core::contract::EventTypes = "a_b:c@1,a:b_c@1".parse().unwrap();
        let err = event_subjects("lifecycle", "p1", &clash).unwrap_err();
        assert!(
            err.contains("a_b:c and a:b_c would both be relayed to lifecycle.p1.a_b_c"),
            "{err}"
        );
    }

    #[test]
    fn a_dotted_project_is_one_token() {
        assert_eq!(
            event_subject("lifecycle", "acme.eu", "task:deleted"),
            "lifecycle.acme%2Eeu.task_deleted"
        );
        assert_eq!(
            reconcile_subject("acme.lifecycle", "a.b.c"),
            "acme.lifecycle.a%2Eb%2Ec.reconcile"
        );
        for project in ["p1", "acme.eu", "a..b", ".x.", "A-Z_0:9@x"] {
            let token = project_token(project);
            assert!(!token.contains(['.', '*', '>', ' ']), "{token}");
            assert_eq!(token.replace("%2E", "."), project, "reversible");
        }
    }
}
