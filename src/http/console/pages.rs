//! The console's pages, as maud templates: every value interpolated into
//! them is escaped (keys, scopes, errors and results are the callers' data),
//! and none carries inline script or style (the Content-Security-Policy
//! forbids both).

use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};

use super::query::{Query, link};
use super::session::Session;
use crate::domain::MAX_OPERATOR_CHARS;
use crate::proto;

/// The longest stretch of a result shown on its page; the rest is in the
/// download.
const PREVIEW_BYTES: usize = 4096;

/// The most a pretty-printed JSON result may take on its page: indentation
/// grows a deeply nested document many times over, so one that would grow
/// past this is shown as it was stored.
const PRETTY_MAX_BYTES: usize = 16 * 1024;

fn layout(session: Option<&Session>, title: &str, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · idempotency console" }
                link rel="stylesheet" href="/console/console.css";
                script src="/console/console.js" defer {}
            }
            body {
                header {
                    a.brand href="/console/" { "idempotency console" }
                    @if let Some(session) = session {
                        span.who { "tenant " strong { (session.caller.tenant.as_str()) } }
                        @if session.auth_on {
                            form.inline method="post" action="/console/logout" {
                                input type="hidden" name="csrf" value=(session.csrf);
                                button type="submit" { "Log out" }
                            }
                        }
                    }
                }
                @if session.is_some_and(|s| !s.auth_on) {
                    p.banner.warning role="alert" {
                        "This server runs without credentials (no --auth-tokens): "
                        "anyone who reaches this port is an administrator."
                    }
                }
                main { (content) }
            }
        }
    }
}

/// The login form, carrying the login CSRF token `csrf`, with why the last
/// attempt failed.
pub(super) fn login(auth_on: bool, error: Option<&str>, csrf: &str) -> Markup {
    let content = html! {
        h1 { "Log in" }
        @if let Some(error) = error {
            p.banner.error role="alert" { (error) }
        }
        @if auth_on {
            form method="post" action="/console/login" {
                input type="hidden" name="csrf" value=(csrf);
                label { "Admin token " input type="password" name="token" autocomplete="off" required; }
                label { "Your name (recorded with your actions: letters, digits, spaces and . - _ ' @) "
                    input type="text" name="operator" maxlength=(MAX_OPERATOR_CHARS); }
                button type="submit" { "Log in" }
            }
        } @else {
            p { "This server runs without credentials: " a href="/console/" { "go to the console" } "." }
        }
    };
    layout(None, "Log in", content)
}

/// A page with one message.
pub(super) fn message(session: &Session, title: &str, text: &str) -> Markup {
    layout(
        Some(session),
        title,
        html! { h1 { (title) } p.message { (text) } p { a href="/console/" { "Back" } } },
    )
}

fn when(t: Option<&prost_types::Timestamp>) -> Option<DateTime<Utc>> {
    let t = t?;
    DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).unwrap_or(0))
}

fn time(t: Option<&prost_types::Timestamp>) -> Markup {
    match when(t) {
        Some(at) => {
            html! { time datetime=(at.to_rfc3339()) { (at.format("%Y-%m-%d %H:%M:%S%.3f UTC")) } }
        }
        None => html! { "—" },
    }
}

fn status_name(status: i32) -> &'static str {
    match proto::Status::try_from(status) {
        Ok(proto::Status::Processing) => "PROCESSING",
        Ok(proto::Status::Succeeded) => "SUCCEEDED",
        Ok(proto::Status::Failed) => "FAILED",
        Ok(proto::Status::FailedPermanent) => "FAILED_PERMANENT",
        _ => "UNKNOWN",
    }
}

fn lookup_forms(scope: &str) -> Markup {
    html! {
        section.lookup {
            form method="get" action="/console/record" {
                h2 { "Find a key" }
                label { "Scope " input type="text" name="scope" value=(scope) required; }
                label { "Key " input type="text" name="key" required; }
                button type="submit" { "Open" }
            }
            form method="get" action="/console/records" {
                h2 { "List keys by prefix" }
                label { "Scope " input type="text" name="scope" value=(scope) required; }
                label { "Prefix " input type="text" name="prefix"; }
                button type="submit" { "List" }
            }
        }
    }
}

/// Scopes on a page of the home page.
pub(super) const SCOPES_PER_PAGE: u32 = 100;

/// The home page: lookups, and a page of the tenant's counts per scope with
/// the due feed's (leases run out, retries due).
pub(super) fn home(session: &Session, summary: &proto::SummarizeResponse) -> Markup {
    let content = html! {
        h1 { "Records" }
        (lookup_forms(""))
        h2 { "Scopes" }
        p.note {
            "Counts of PROCESSING, FAILED and FAILED_PERMANENT records are exact; "
            "all records are counted up to a cap (“+” above it). "
            "Scopes are shown " (SCOPES_PER_PAGE) " to a page, in order."
        }
        table.summary {
            thead { tr {
                th { "Scope" } th { "Records" } th { "Succeeded" } th { "Processing" }
                th { "Leases run out" } th { "Failed" } th { "Retries due" } th { "Failed permanently" }
            } }
            tbody {
                @for s in &summary.scopes {
                    @let plus = if s.records_capped { "+" } else { "" };
                    @let others = s.processing + s.failed + s.failed_permanent;
                    tr {
                        td { a href=(link("records", &[("scope", &s.scope)])) { (s.scope) } }
                        td.n { (s.records) (plus) }
                        td.n { (s.records.saturating_sub(others)) (plus) }
                        td.n { a href=(link("records", &[("scope", &s.scope), ("status", "PROCESSING")])) { (s.processing) } }
                        td.n.due[s.leases_expired > 0] { (s.leases_expired) }
                        td.n { a href=(link("records", &[("scope", &s.scope), ("status", "FAILED")])) { (s.failed) } }
                        td.n.due[s.retries_due > 0] { (s.retries_due) }
                        td.n { a href=(link("records", &[("scope", &s.scope), ("status", "FAILED_PERMANENT")])) { (s.failed_permanent) } }
                    }
                }
                @if summary.scopes.is_empty() {
                    tr { td colspan="8" { "No records." } }
                }
            }
        }
        @if !summary.next_page_token.is_empty() {
            p { a rel="next" href=(link("", &[("after", &summary.next_page_token)])) { "Next scopes →" } }
        }
    };
    layout(Some(session), "Records", content)
}

/// One page of a scope's keys.
pub(super) fn records(
    session: &Session,
    query: &Query,
    page: &proto::ListRecordsResponse,
) -> Markup {
    let (scope, prefix, status) = (query.get("scope"), query.get("prefix"), query.get("status"));
    let content = html! {
        h1 { "Keys of " code { (scope) } @if !prefix.is_empty() { " beginning with " code { (prefix) } }
            @if !status.is_empty() { " (" (status) ")" } }
        (lookup_forms(scope))
        table.records {
            thead { tr { th { "Key" } th { "Status" } th { "Attempts" } th { "Lease until" }
                th { "Retry at" } th { "Updated" } } }
            tbody {
                @for r in &page.records {
                    tr {
                        td { a href=(link("record", &[("scope", scope), ("key", &r.key)])) { code { (r.key) } } }
                        td { (status_name(r.status)) }
                        td.n { (r.attempt_count) " / " (r.max_attempts) }
                        td { (time(r.lease_expires_at.as_ref())) }
                        td { (time(r.next_retry_at.as_ref())) }
                        td { (time(r.updated_at.as_ref())) }
                    }
                }
                @if page.records.is_empty() { tr { td colspan="6" { "No records." } } }
            }
        }
        @if !page.next_page_token.is_empty() {
            p { a rel="next" href=(link("records", &[("scope", scope), ("prefix", prefix),
                ("status", status), ("after", &page.next_page_token)])) { "Next page →" } }
        }
    };
    layout(Some(session), "Keys", content)
}

/// The confirmation of an action, with the form that runs it.
pub(super) fn confirm(session: &Session, query: &Query) -> Markup {
    let (action, scope, key) = (query.get("action"), query.get("scope"), query.get("key"));
    let what = match action {
        "release" => "Release the lease (its holder's next Complete is refused with LEASE_LOST)",
        "retry" => "Retry now (the FAILED record's retry becomes due at once)",
        "fail" => {
            "Fail permanently (the record becomes FAILED_PERMANENT; the reason becomes its error)"
        }
        "delete" => "Delete the record (its next Acquire starts afresh)",
        _ => "Unknown action",
    };
    let content = html! {
        h1 { "Confirm" }
        p.confirm { (what) " for key " code { (key) } " of scope " code { (scope) } "?" }
        form method="post" action="/console/act" {
            input type="hidden" name="csrf" value=(session.csrf);
            input type="hidden" name="action" value=(action);
            input type="hidden" name="scope" value=(scope);
            input type="hidden" name="key" value=(key);
            label { "Reason " textarea name="reason" maxlength="1000" required[action == "fail"] {} }
            button.danger type="submit" id="confirm" { "Confirm" }
            " " a href=(link("record", &[("scope", scope), ("key", key)])) { "Cancel" }
        }
    };
    layout(Some(session), "Confirm", content)
}

fn action_button(scope: &str, key: &str, action: &str, label: &str) -> Markup {
    html! {
        form.inline method="get" action="/console/confirm" {
            input type="hidden" name="action" value=(action);
            input type="hidden" name="scope" value=(scope);
            input type="hidden" name="key" value=(key);
            button type="submit" id={ "action-" (action) } { (label) }
        }
    }
}

/// The stored result: pretty JSON (when small), text, or a hex preview,
/// never more than [`PREVIEW_BYTES`] of it, nor more than
/// [`PRETTY_MAX_BYTES`] of markup.
fn result(r: &proto::Record, success: &proto::Success) -> Markup {
    let bytes = &success.result;
    let shown = &bytes[..bytes.len().min(PREVIEW_BYTES)];
    let json = (success.content_type.contains("json") && bytes.len() <= PREVIEW_BYTES)
        .then(|| serde_json::from_slice::<serde_json::Value>(bytes).ok())
        .flatten()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .filter(|pretty| pretty.len() <= PRETTY_MAX_BYTES);
    let textual =
        success.content_type.starts_with("text/") || success.content_type.contains("json");
    let text = textual.then(|| utf8_prefix(shown)).flatten();
    html! {
        h2 { "Result" }
        dl {
            dt { "Size" } dd { (bytes.len()) " bytes" }
            dt { "Content type" } dd { code { (success.content_type) } }
            dt { "Status code" } dd { (success.status_code) }
            @if !success.result_ref.is_empty() { dt { "Stored elsewhere" } dd { code { (success.result_ref) } } }
        }
        @if let Some(json) = json {
            pre.result { (json) }
        } @else if let Some(text) = text {
            pre.result { (text) }
        } @else {
            pre.result.hex { (hex_preview(shown)) }
        }
        @if bytes.len() > PREVIEW_BYTES { p.note { "The first " (PREVIEW_BYTES) " bytes; download for the rest." } }
        p { a href=(link("result", &[("scope", &r.scope), ("key", &r.key)])) download { "Download the result" } }
    }
}

/// `bytes` as text, a character cut at the end dropped; `None` when they
/// are not UTF-8 before that.
fn utf8_prefix(bytes: &[u8]) -> Option<&str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Some(text),
        // At most three bytes of a character cut by the preview's end.
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&bytes[..e.valid_up_to()]).ok(),
        Err(_) => None,
    }
}

/// Offset, hex and printable characters, 16 bytes a line.
fn hex_preview(bytes: &[u8]) -> String {
    bytes
        .chunks(16)
        .enumerate()
        .map(|(i, chunk)| {
            let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
            let text: String = chunk
                .iter()
                .map(|&b| {
                    if b.is_ascii_graphic() || b == b' ' {
                        b as char
                    } else {
                        '.'
                    }
                })
                .collect();
            format!("{:08x}  {:<48}  {text}\n", i * 16, hex.join(" "))
        })
        .collect()
}

fn lease(r: &proto::Record, processing: bool) -> Markup {
    let expires = when(r.lease_expires_at.as_ref());
    html! {
        h2 { "Lease" }
        dl {
            dt { "Request id" } dd { code { (r.lease_request_id) } }
            dt { "Fencing token" } dd #fencing { (r.fencing_token) }
            dt { "Expires" }
            dd {
                (time(r.lease_expires_at.as_ref()))
                @if let (true, Some(at)) = (processing, expires) {
                    " " span #countdown data-expires=(at.timestamp_millis()) {}
                }
            }
        }
    }
}

fn admin_note(r: &proto::Record) -> Markup {
    html! {
        @if let Some(a) = &r.admin_action {
            h2 { "Last administrator's action" }
            dl.admin {
                dt { "Action" } dd { (a.action) }
                dt { "Who" } dd { (a.actor) }
                dt { "Why" } dd { (a.reason) }
                dt { "When" } dd { (time(a.at.as_ref())) }
            }
        }
    }
}

/// A record's page: everything it holds, the actions its status allows,
/// and (while PROCESSING) the hook the script follows it live by.
pub(super) fn record(session: &Session, r: &proto::Record) -> Markup {
    let status = status_name(r.status);
    let processing = status == "PROCESSING";
    let content = html! {
        h1 { "Key " code #key { (r.key) } }
        p { "Scope " code { (r.scope) } }
        section #record data-scope=(r.scope) data-key=(r.key) data-status=(status)
            data-watch=(link("watch", &[("scope", &r.scope), ("key", &r.key)])) {
            dl {
                dt { "Status" } dd { strong #status { (status) } span #live {} }
                dt { "Attempts" } dd #attempts { (r.attempt_count) " of " (r.max_attempts) }
                dt { "Fingerprint" } dd { code { (r.fingerprint) } }
                dt { "Last error" } dd { pre #last-error { (r.last_error) } }
                dt { "Last error at" } dd { (time(r.last_error_at.as_ref())) }
                dt { "Next retry" } dd { (time(r.next_retry_at.as_ref())) }
                dt { "Checkpoint" } dd { (r.checkpoint.len()) " bytes" }
                dt { "Created" } dd { (time(r.created_at.as_ref())) }
                dt { "Updated" } dd { (time(r.updated_at.as_ref())) }
                dt { "Completed" } dd { (time(r.completed_at.as_ref())) }
                dt { "Kept until" } dd { (time(r.expires_at.as_ref())) }
            }
        }
        (lease(r, processing))
        @if let Some(success) = &r.result { (result(r, success)) }
        (admin_note(r))
        h2 { "Actions" }
        p.actions {
            @if processing { (action_button(&r.scope, &r.key, "release", "Release lease")) }
            @if status == "FAILED" { (action_button(&r.scope, &r.key, "retry", "Retry now")) }
            @if processing || status == "FAILED" {
                (action_button(&r.scope, &r.key, "fail", "Fail permanently"))
            }
            (action_button(&r.scope, &r.key, "delete", "Delete"))
        }
    };
    layout(Some(session), "Record", content)
}
