//! The admin RPCs: an admin credential's actions on its own tenant's
//! records (ReleaseLease, RetryNow, FailPermanently, DeleteRecord), pages
//! of a scope's keys (ListRecords) and the tenant's counts per scope
//! (Summarize). Each action is recorded on the record by the store and
//! logged here with who asked.

use sha2::{Digest, Sha256};
use tonic::{Request, Status};

use super::{CoordinatorService, call_budget, call_time, encode};
use crate::auth::Caller;
use crate::domain::{
    AdminAction, AdminCommand, InvalidInput, Key, ListQuery, RecordId, Scope,
    Status as RecordStatus, SummaryQuery, operator_name,
};
use crate::error::{Error, Violation};
use crate::proto;
use crate::store::CallTime;

/// The longest reason recorded.
const MAX_REASON_CHARS: usize = 1000;
/// Records on a page unless the caller asks for another number.
const DEFAULT_PAGE: u32 = 50;
/// Records on a page at most.
const MAX_PAGE: u32 = 500;
/// Scopes on a page of Summarize unless the caller asks for another number.
const DEFAULT_SCOPES: u32 = 100;
/// Scopes on a page of Summarize at most: each costs a few index reads.
const MAX_SCOPES: u32 = 500;

/// Collects violations while fields are checked, named as in the proto.
#[derive(Default)]
struct Violations(Vec<Violation>);

impl Violations {
    fn check<T>(&mut self, field: &str, result: Result<T, InvalidInput>) -> Option<T> {
        result
            .map_err(|e| {
                self.0.push(Violation {
                    field: field.to_owned(),
                    description: e.0,
                })
            })
            .ok()
    }
}

fn text(value: &str, max: usize, required: bool) -> Result<(), InvalidInput> {
    if required && value.trim().is_empty() {
        return Err(InvalidInput("must not be empty".to_owned()));
    }
    if value.contains('\0') {
        return Err(InvalidInput("must not contain NUL characters".to_owned()));
    }
    let chars = value.chars().count();
    if chars > max {
        return Err(InvalidInput(format!(
            "must be at most {max} characters, got {chars}"
        )));
    }
    Ok(())
}

/// Who the caller is, for the record and the log: which credential (the
/// start of its token's SHA-256, never the token) and the operator's name.
fn actor<T>(request: &Request<T>, operator: &str) -> String {
    let credential = request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .map(|(_, token)| {
            let digest = hex::encode(Sha256::digest(token.trim().as_bytes()));
            format!("credential sha256:{}", &digest[..12])
        })
        .unwrap_or_else(|| "authentication off".to_owned());
    if operator.is_empty() {
        credential
    } else {
        format!("{credential}, operator {operator}")
    }
}

impl CoordinatorService {
    /// The caller, if it holds an admin credential.
    fn admin<T>(&self, request: &Request<T>) -> Result<Caller, Error> {
        let caller = self.caller(request)?;
        if !caller.admin {
            return Err(Error::PermissionDenied(
                "the admin RPCs need an admin credential",
            ));
        }
        Ok(caller)
    }

    /// An admin's request about one record, validated.
    fn admin_command<T>(
        &self,
        request: &Request<T>,
        target: Option<&proto::AdminTarget>,
        reason_required: bool,
    ) -> Result<(AdminCommand, CallTime), Error> {
        let caller = self.admin(request)?;
        let default = proto::AdminTarget::default();
        let target = target.unwrap_or(&default);
        let mut v = Violations::default();
        let scope = v.check("target.scope", Scope::try_from(target.scope.clone()));
        let key = v.check("target.key", Key::try_from(target.key.clone()));
        v.check(
            "target.reason",
            text(&target.reason, MAX_REASON_CHARS, reason_required),
        );
        v.check("target.operator", operator_name(&target.operator));
        let (Some(scope), Some(key), true) = (scope, key, v.0.is_empty()) else {
            return Err(Error::InvalidArgument(v.0));
        };
        let cmd = AdminCommand {
            id: RecordId {
                tenant: caller.tenant,
                scope,
                key,
            },
            actor: actor(request, &target.operator),
            reason: target.reason.clone(),
        };
        Ok((cmd, call_time(call_budget(request))))
    }

    /// Runs one action and logs it; the record after it.
    pub(super) async fn admin_act<T>(
        &self,
        request: Request<T>,
        target: impl Fn(&T) -> Option<&proto::AdminTarget>,
        action: AdminAction,
    ) -> Result<proto::Record, Status> {
        let required = action == AdminAction::FailPermanently;
        let (cmd, time) = self.admin_command(&request, target(request.get_ref()), required)?;
        let record = self
            .store
            .admin_act(&cmd, action, time)
            .await
            .map_err(|e| Error::from_store(e, self.store.metrics()))?;
        tracing::info!(
            action = action.name(),
            tenant = cmd.id.tenant.as_str(),
            scope = cmd.id.scope.as_str(),
            key = cmd.id.key.as_str(),
            actor = cmd.actor,
            reason = cmd.reason,
            "admin action"
        );
        Ok(encode::record(record))
    }

    /// Deletes one record and logs it; the record as it was.
    pub(super) async fn admin_delete(
        &self,
        request: Request<proto::DeleteRecordRequest>,
    ) -> Result<proto::Record, Status> {
        let (cmd, time) = self.admin_command(&request, request.get_ref().target.as_ref(), false)?;
        let record = self
            .store
            .admin_delete(&cmd.id, time)
            .await
            .map_err(|e| Error::from_store(e, self.store.metrics()))?;
        tracing::info!(
            action = "DELETE",
            tenant = cmd.id.tenant.as_str(),
            scope = cmd.id.scope.as_str(),
            key = cmd.id.key.as_str(),
            actor = cmd.actor,
            reason = cmd.reason,
            "admin action"
        );
        Ok(encode::record(record))
    }

    /// One page of a scope's keys.
    pub(super) async fn admin_list(
        &self,
        request: Request<proto::ListRecordsRequest>,
    ) -> Result<proto::ListRecordsResponse, Status> {
        let caller = self.admin(&request)?;
        let time = call_time(call_budget(&request));
        let req = request.into_inner();
        let query = list_query(caller, req)?;
        let lines = self
            .store
            .admin_list(&query, time)
            .await
            .map_err(|e| Error::from_store(e, self.store.metrics()))?;
        let next_page_token = if lines.len() == query.limit as usize {
            lines.last().map(|l| l.key.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(proto::ListRecordsResponse {
            records: lines.into_iter().map(encode::record_line).collect(),
            next_page_token,
        })
    }

    /// A page of the caller's tenant's counts per scope.
    pub(super) async fn admin_summary(
        &self,
        request: Request<proto::SummarizeRequest>,
    ) -> Result<proto::SummarizeResponse, Status> {
        let caller = self.admin(&request)?;
        let time = call_time(call_budget(&request));
        let query = summary_query(caller, request.into_inner())?;
        let summary = self
            .store
            .admin_summary(&query, time)
            .await
            .map_err(|e| Error::from_store(e, self.store.metrics()))?;
        Ok(encode::summary(summary))
    }
}

/// A Summarize request, validated.
fn summary_query(caller: Caller, req: proto::SummarizeRequest) -> Result<SummaryQuery, Error> {
    let mut v = Violations::default();
    let after = if req.page_token.is_empty() {
        None
    } else {
        v.check("page_token", Scope::try_from(req.page_token))
    };
    if req.page_size > MAX_SCOPES {
        v.check::<()>(
            "page_size",
            Err(InvalidInput(format!("must be at most {MAX_SCOPES}"))),
        );
    }
    if !v.0.is_empty() {
        return Err(Error::InvalidArgument(v.0));
    }
    Ok(SummaryQuery {
        tenant: caller.tenant,
        after,
        limit: if req.page_size == 0 {
            DEFAULT_SCOPES
        } else {
            req.page_size
        },
    })
}

/// A ListRecords request, validated.
fn list_query(caller: Caller, req: proto::ListRecordsRequest) -> Result<ListQuery, Error> {
    let mut v = Violations::default();
    let scope = v.check("scope", Scope::try_from(req.scope));
    v.check("key_prefix", text(&req.key_prefix, Key::MAX_CHARS, false));
    let after = if req.page_token.is_empty() {
        None
    } else {
        v.check("page_token", Key::try_from(req.page_token))
    };
    let status = match proto::Status::try_from(req.status) {
        Ok(proto::Status::Unspecified) => None,
        Ok(proto::Status::Processing) => Some(RecordStatus::Processing),
        Ok(proto::Status::Succeeded) => Some(RecordStatus::Succeeded),
        Ok(proto::Status::Failed) => Some(RecordStatus::Failed),
        Ok(proto::Status::FailedPermanent) => Some(RecordStatus::FailedPermanent),
        Err(_) => {
            v.check::<()>("status", Err(InvalidInput("is not a known status".into())));
            None
        }
    };
    if req.page_size > MAX_PAGE {
        v.check::<()>(
            "page_size",
            Err(InvalidInput(format!("must be at most {MAX_PAGE}"))),
        );
    }
    let (Some(scope), true) = (scope, v.0.is_empty()) else {
        return Err(Error::InvalidArgument(v.0));
    };
    Ok(ListQuery {
        tenant: caller.tenant,
        scope,
        prefix: req.key_prefix,
        after,
        status,
        limit: if req.page_size == 0 {
            DEFAULT_PAGE
        } else {
            req.page_size
        },
    })
}
