//! Scheduled delivery over HTTP: `deliver_at`/`delay_ms` on the publish
//! endpoints (answered `202` once the schedule is durable),
//! `GET /api/v1/scheduled` and `DELETE /api/v1/scheduled/{id}`.
//!
//! An Idempotency-Key dedups the schedule, not its delivery (a schedule is
//! delivered once by construction): the same request again replays the
//! `202` with the original id and `deliver_at`. Schedule receipts live
//! under their own keys (`schedule:` + the publish key), so a key used for
//! a schedule and for an immediate publish are two requests.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use herald_core::{Dedup, NamespaceOptions, Schedule, ScheduleReceipt, ScheduleRequest};
use herald_proto::{
    ChannelName, ErrorCode, Meta, ScheduledBatchReply, ScheduledEntry, ScheduledList, ScheduledQuery,
    ScheduledReceipt,
};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::{json_response, St};
use crate::api::extract::{parse_channel, ApiKey, Q};
use crate::error::ApiError;
use crate::publish::{fingerprint, ScopedKey};
use crate::rooms::now_ms;
use crate::state::AppState;

/// Most schedules one list request returns.
const MAX_LIST: usize = 1000;

/// A publish request that asked for scheduled delivery.
pub(crate) struct ScheduleAsk<'a> {
    pub scope: &'a str,
    pub key: Option<&'a str>,
    pub targets: Vec<(ChannelName, &'a NamespaceOptions)>,
    pub data: Box<RawValue>,
    pub meta: Option<Meta>,
    pub deliver_at: Option<u64>,
    pub delay_ms: Option<u64>,
    /// `POST /api/v1/publish`: answer with `results`.
    pub batch: bool,
}

/// Whether a body asks for scheduled delivery.
pub(crate) fn asked(deliver_at: Option<u64>, delay_ms: Option<u64>) -> bool {
    deliver_at.is_some() || delay_ms.is_some()
}

/// The time to deliver at: one of the two fields, at most
/// `publish.max_schedule_ahead` from now, a past time meaning now.
fn resolve_time(
    state: &AppState,
    deliver_at: Option<u64>,
    delay_ms: Option<u64>,
    now: u64,
) -> Result<u64, ApiError> {
    let at = match (deliver_at, delay_ms) {
        (Some(_), Some(_)) => {
            return Err(ApiError::new(ErrorCode::BadRequest, "give `deliver_at` or `delay_ms`, not both"))
        }
        (Some(at), None) => at,
        (None, Some(d)) => now.saturating_add(d),
        (None, None) => now,
    };
    let ahead = state.config().publish.max_schedule_ahead;
    let max = now.saturating_add(u64::try_from(ahead.as_millis()).unwrap_or(u64::MAX));
    if at > max {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!("`deliver_at` is more than {} s ahead (publish.max_schedule_ahead)", ahead.as_secs()),
        ));
    }
    Ok(at.max(now))
}

/// The request's fingerprint: the publish fingerprint plus the time as
/// asked (a retry of "in 2 s" is the same request, whenever it comes).
fn schedule_fingerprint(channels: &[ChannelName], ask: &ScheduleAsk<'_>) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"herald schedule v1\0");
    h.update(fingerprint(channels, &ask.data, ask.meta.as_ref()));
    match (ask.deliver_at, ask.delay_ms) {
        (Some(at), _) => {
            h.update(b"at");
            h.update(at.to_be_bytes());
        }
        (None, Some(d)) => {
            h.update(b"in");
            h.update(d.to_be_bytes());
        }
        (None, None) => {}
    }
    h.finalize().into()
}

fn receipt(r: &ScheduleReceipt) -> ScheduledReceipt {
    ScheduledReceipt {
        scheduled_id: r.id.to_string(),
        channel: r.channel.as_str().to_owned(),
        deliver_at: r.deliver_at,
    }
}

fn entry(s: &Schedule) -> ScheduledEntry {
    ScheduledEntry {
        id: s.id.to_string(),
        channel: s.channel.as_str().to_owned(),
        deliver_at: s.deliver_at,
        created_at: s.created_at,
        size: s.size() as u64,
    }
}

/// Store the schedules of a publish request and answer `202`.
pub(crate) async fn schedule(state: &Arc<AppState>, ask: ScheduleAsk<'_>) -> Result<Response, ApiError> {
    let batch = ask.batch;
    let receipts = store(state, ask).await?;
    let replayed = receipts.iter().all(|r| r.duplicate);
    Ok(if batch {
        let body = ScheduledBatchReply { results: receipts.iter().map(receipt).collect() };
        json_response(StatusCode::ACCEPTED, &body, replayed)
    } else {
        json_response(StatusCode::ACCEPTED, &receipt(&receipts[0]), replayed)
    })
}

/// Store the schedules of a publish request: one receipt per target, in
/// order.
pub(crate) async fn store(state: &AppState, ask: ScheduleAsk<'_>) -> Result<Vec<ScheduleReceipt>, ApiError> {
    state.check_publish_data(&ask.data)?;
    let now = now_ms();
    let deliver_at = resolve_time(state, ask.deliver_at, ask.delay_ms, now)?;
    crate::rooms::require_rooms(state, &ask.targets).await?;
    let names: Vec<ChannelName> = ask.targets.iter().map(|(c, _)| c.clone()).collect();
    let fp = schedule_fingerprint(&names, &ask);
    let scoped = ask.key.map(|k| ScopedKey::new(ask.scope, k));
    let anchor: Option<Arc<str>> = scoped.as_ref().map(|s| Arc::from(format!("schedule:{}", s.anchor())));
    let _claim = match &anchor {
        Some(a) => Some(state.in_flight.claim(a)?),
        None => None,
    };
    let ttl = state.config().idempotency_ttl;
    let mut receipts = Vec::with_capacity(ask.targets.len());
    // One after the other: with a key, the first channel decides (a
    // mismatch there schedules nothing); a retry completes a partial batch.
    for (i, (channel, _)) in ask.targets.iter().enumerate() {
        let dedup = scoped.as_ref().map(|s| Dedup {
            key: if i == 0 {
                anchor.clone().expect("anchor with a key")
            } else {
                Arc::from(format!("schedule:{}", s.for_channel(channel)))
            },
            fingerprint: fp,
            ttl,
        });
        let req = ScheduleRequest {
            channel: channel.clone(),
            deliver_at,
            data: ask.data.clone(),
            meta: ask.meta.clone(),
            dedup,
        };
        let r = state.engine.schedule(req).await?;
        if !r.duplicate {
            state.scheduler.added(r.deliver_at);
        }
        receipts.push(r);
    }
    Ok(receipts)
}

/// `GET /api/v1/scheduled?channel=C&limit=N`: pending schedules of a
/// channel, in delivery order.
pub async fn list(State(state): St, _key: ApiKey, Q(q): Q<ScheduledQuery>) -> Result<Response, ApiError> {
    let Some(channel) = q.channel else {
        return Err(ApiError::new(ErrorCode::BadRequest, "`channel` is required"));
    };
    let (channel, _ns) = parse_channel(&state, &channel)?;
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_LIST {
        return Err(ApiError::new(ErrorCode::BadRequest, format!("`limit` must be 1..={MAX_LIST}")));
    }
    let list = state.engine.scheduled(&channel, limit).await?;
    let body =
        ScheduledList { channel: channel.as_str().to_owned(), scheduled: list.iter().map(entry).collect() };
    Ok(json_response(StatusCode::OK, &body, false))
}

/// `DELETE /api/v1/scheduled/{id}`: cancel a pending schedule.
pub async fn cancel(State(state): St, _key: ApiKey, Path(id): Path<String>) -> Result<Response, ApiError> {
    if id.is_empty() || id.len() > 64 || id.chars().any(char::is_control) {
        return Err(no_such_schedule());
    }
    match state.engine.schedule_cancel(&id).await? {
        Some(s) => {
            state.metrics.scheduled_cancelled.inc();
            Ok(json_response(StatusCode::OK, &entry(&s), false))
        }
        None => Err(no_such_schedule()),
    }
}

fn no_such_schedule() -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        "no pending schedule with this id (never made, delivered or cancelled)",
    )
}
