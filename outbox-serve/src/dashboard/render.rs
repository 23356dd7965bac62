//! The dashboard's HTML, built with `maud`: every value is escaped by construction, so a
//! project ID, an event ID or a failure reason can never inject markup.

use maud::{DOCTYPE, Markup, PreEscaped, html};
use outbox_core::admin::{AuditEntry, DeadLetter, Listing, Status};
use outbox_core::states::Health;

use super::assets::{SCRIPT, STYLE};
use crate::auth::AdminAuth;

/// Shown for a value that is absent.
const NONE: &str = "–";

/// A value, or [`NONE`].
fn opt<T: std::fmt::Display>(value: &Option<T>) -> String {
    value
        .as_ref()
        .map_or_else(|| NONE.to_owned(), |v| v.to_string())
}

fn health_badges(codes: &[Health]) -> Markup {
    html! {
        @for (i, h) in codes.iter().enumerate() {
            @if i > 0 { " " }
            span class={ "badge " (if h.as_str() == "ok" { "ok" } else { "bad" }) } { (h.as_str()) }
        }
    }
}

/// The `outbox status` view as HTML tables.
pub(super) fn status(status: &Status) -> Markup {
    html! {
        table {
            thead { tr { th { "project" } th { "head" } th { "unsequenced" } th { "floor" }
                th { "prunable" } th { "health" } } }
            tbody {
                @for p in &status.projects {
                    tr { td { (p.project_id) } td { (p.head_sequence) } td { (p.unsequenced) }
                        td { (p.pruned_through) } td { (p.prunable) }
                        td { (health_badges(&p.health)) } }
                }
            }
        }
        table {
            thead { tr { th { "project" } th { "consumer" } th { "state" } th { "cursor" }
                th { "lag" } th { "lease" } th { "retrying" } th { "dead letters" }
                th { "health" } } }
            tbody {
                @for c in &status.consumers {
                    @let info = &c.consumer;
                    tr {
                        td { (info.project_id) } td { (info.consumer_id) }
                        td { (info.state.as_str()) } td { (opt(&info.cursor)) }
                        td { (opt(&info.lag)) }
                        td {
                            @if info.lease_live {
                                "held by " (opt(&info.lease_owner)) " (gen "
                                (info.lease_generation) ")"
                            } @else {
                                "free (gen " (info.lease_generation) ")"
                            }
                        }
                        td {
                            @match &info.retrying {
                                Some(r) => {
                                    (r.event_id) " (seq " (r.sequence) ", " (r.attempts)
                                    " attempts, " (opt(&r.last_failure_class)) ")"
                                }
                                None => (NONE),
                            }
                        }
                        td { (info.dead_letters) } td { (health_badges(&c.health)) }
                    }
                }
            }
        }
        p.muted { "as of " (outbox_core::event::format_timestamp(status.as_of)) }
    }
}

/// The dead letters, with replay and resolve buttons when `admin`.
pub(super) fn dead_letters(listing: &Listing<DeadLetter>, admin: bool) -> Markup {
    if listing.items.is_empty() {
        return html! { p.muted { "no dead letters" } };
    }
    html! {
        table {
            thead { tr { th { "project" } th { "consumer" } th { "event" } th { "seq" }
                th { "state" } th { "attempts" } th { "class" } th { "parked" }
                @if admin { th { "actions" } } } }
            tbody {
                @for d in &listing.items {
                    tr {
                        td { (d.project_id) } td { (d.consumer_id) } td { (d.event_id) }
                        td { (d.sequence) } td { (d.state.as_str()) } td { (d.attempts) }
                        td { (opt(&d.last_failure_class)) }
                        td { (opt(&d.parked_at.map(outbox_core::event::format_timestamp))) }
                        @if admin {
                            td {
                                @for (action, gap) in [("replay", " "), ("resolve", "")] {
                                    button.act data-action=(action) data-project=(d.project_id)
                                        data-consumer=(d.consumer_id) data-event=(d.event_id)
                                        { (action) }
                                    (gap)
                                }
                            }
                        }
                    }
                }
            }
        }
        @if listing.truncated { p.muted { "more dead letters than shown" } }
    }
}

/// The audit trail.
pub(super) fn audit(listing: &Listing<AuditEntry>) -> Markup {
    if listing.items.is_empty() {
        return html! { p.muted { "no audit entries" } };
    }
    html! {
        table {
            thead { tr { th { "when" } th { "kind" } th { "project" } th { "consumer" }
                th { "event" } th { "actor" } th { "count" } th { "reason" } } }
            tbody {
                @for a in &listing.items {
                    tr {
                        td { (outbox_core::event::format_timestamp(a.recorded_at)) }
                        td { (a.kind.as_str()) } td { (opt(&a.project_id)) }
                        td { (opt(&a.consumer_id)) } td { (opt(&a.event_id)) }
                        td { (opt(&a.actor)) } td { (opt(&a.count)) } td { (opt(&a.reason)) }
                    }
                }
            }
        }
    }
}

/// A section that could not be read.
pub(super) fn unreadable(error: &str) -> Markup {
    html! { p.down { "cannot read the database: " (error) } }
}

/// What the page shows in its sections when it is first served.
pub(super) struct Sections {
    /// [`status`].
    pub status: Markup,
    /// [`dead_letters`].
    pub dead_letters: Markup,
    /// [`audit`].
    pub audit: Markup,
}

/// The admin section, or a note on how to enable it.
fn admin_section(admin: Option<&AdminAuth>) -> Markup {
    let Some(auth) = admin else {
        return html! {
            p.muted { "Read-only: start outbox serve with --admin-token to replay, resolve and \
                       retire from here." }
        };
    };
    html! {
        section #admin {
            h2 { "Admin" }
            p { "Actions are recorded as operator " b { (auth.operator.as_str()) }
                ". The token is sent in the Authorization header and kept only in this page." }
            label { "Admin token " input #token type="password" autocomplete="off"; }
            form #retire {
                b { "Retire a consumer:" } " "
                input name="project" placeholder="project" required;
                input name="consumer" placeholder="consumer ID" required;
                input name="reason" placeholder="reason" required;
                button { "retire" }
            }
            pre #admin-result {}
        }
    }
}

/// The whole page of `consumer`, following `projects`.
pub(super) fn page(
    consumer: &str,
    projects: &[&String],
    sections: Sections,
    admin: Option<&AdminAuth>,
) -> Markup {
    // JSON inside <script>: escape '<' so no "</script>" can end the element early.
    let projects_json = serde_json::to_string(projects)
        .unwrap_or_else(|_| "[]".into())
        .replace('<', "\\u003c");
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "outbox: " (consumer) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                h1 { "lifecycle-outbox " span.muted { "consumer " (consumer) } " "
                    span #conn .down { "connecting…" } }
                h2 { "Status" } div #status { (sections.status) }
                h2 { "Live events" } ul #feed {}
                h2 { "Dead letters" } div #dead-letters { (sections.dead_letters) }
                h2 { "Audit trail" } div #audit { (sections.audit) }
                (admin_section(admin))
                script type="application/json" #projects { (PreEscaped(projects_json)) }
                script { (PreEscaped(SCRIPT)) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped() {
        let markup = html! { td { ("<a href=\"x\">'&'</a>") } };
        assert_eq!(
            markup.into_string(),
            "<td>&lt;a href=&quot;x&quot;&gt;'&amp;'&lt;/a&gt;</td>"
        );
    }

    #[test]
    fn project_ids_cannot_end_the_script() {
        let evil = "</script><b>".to_owned();
        let sections = Sections {
            status: html! {},
            dead_letters: html! {},
            audit: html! {},
        };
        let page = page("c", &[&evil], sections, None).into_string();
        assert!(!page.contains("</script><b>"), "{page}");
    }
}
