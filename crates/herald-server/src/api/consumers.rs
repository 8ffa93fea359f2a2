//! `/api/v1/consumers`: the status of every outbox consumer, its parked
//! rows, and the operator's retry of one.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use herald_proto::{
    ConsumerError, ConsumerPartitionStatus, ConsumerStatus, ConsumersStatus, ErrorCode, ParkedRetried,
    ParkedRow, ParkedRows,
};

use crate::api::extract::ApiKey;
use crate::error::ApiError;
use crate::integration::consumers::{postgres, Consumer, ConsumerKind};
use crate::state::AppState;

/// Parked rows listed at most.
const PARKED_LIMIT: i64 = 1000;

fn consumer<'a>(state: &'a AppState, name: &str) -> Result<&'a Arc<Consumer>, ApiError> {
    state
        .consumers
        .get(name)
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "no consumer with this name is configured"))
}

/// The source could not be reached or refused the statement: a 503, its
/// text without the connection string.
fn unavailable(e: postgres::SourceError) -> ApiError {
    ApiError { retry_after: Some(1), ..ApiError::new(ErrorCode::Unavailable, e.to_string()) }
}

fn postgres_only(c: &Consumer) -> Result<(), ApiError> {
    if c.cfg.kind != Some(ConsumerKind::Postgres) {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            "this consumer has no dead-letter table (postgres only)",
        ));
    }
    Ok(())
}

/// `GET /api/v1/consumers`: per consumer and partition, as this node sees
/// it (ownership, token, lag, last id, parked rows, last error).
pub async fn status(State(state): State<Arc<AppState>>, _key: ApiKey) -> Result<Response, ApiError> {
    let consumers = state
        .consumers
        .list
        .iter()
        .map(|c| ConsumerStatus {
            name: c.cfg.name.clone(),
            kind: match c.cfg.kind {
                Some(ConsumerKind::RedisStream) => "redis-stream",
                _ => "postgres",
            }
            .to_owned(),
            published: c.published(),
            parked: c.parked(),
            partitions: (0..c.partitions.len())
                .map(|p| {
                    let s = c.partition(p);
                    let owned = s.is_owned();
                    ConsumerPartitionStatus {
                        partition: p as u32,
                        owned,
                        token: owned.then_some(s.token),
                        lag: s.lag,
                        scheduled_rows: s.scheduled_rows,
                        last_id: s.last_id,
                        parked_rows: s.parked_rows,
                        last_error: s.last_error.map(|e| ConsumerError { at: e.at_ms, message: e.message }),
                    }
                })
                .collect(),
        })
        .collect();
    Ok(Json(ConsumersStatus { consumers }).into_response())
}

/// `GET /api/v1/consumers/{name}/parked`: the consumer's parked rows,
/// oldest id first (at most 1000).
pub async fn parked(
    State(state): State<Arc<AppState>>,
    _key: ApiKey,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let c = consumer(&state, &name)?;
    postgres_only(c)?;
    let rows = postgres::list_parked(&c.cfg, PARKED_LIMIT).await.map_err(unavailable)?;
    let rows = rows
        .into_iter()
        .map(|r| ParkedRow {
            id: r.id,
            channel: r.channel,
            channels: r.channels,
            code: r.code,
            error: r.error,
            parked_at: r.parked_at_ms,
        })
        .collect();
    Ok(Json(ParkedRows { consumer: name, rows }).into_response())
}

/// `POST /api/v1/consumers/{name}/parked/{id}/retry`: put a parked row back
/// into the outbox (as a new row, so after the rows already there) and
/// wake the consumer. Logged at warn with the API key's label.
pub async fn retry(
    State(state): State<Arc<AppState>>,
    ApiKey(scope): ApiKey,
    Path((name, id)): Path<(String, i64)>,
) -> Result<Response, ApiError> {
    let c = consumer(&state, &name)?;
    postgres_only(c)?;
    let Some(new_id) = postgres::retry_parked(&c.cfg, id).await.map_err(unavailable)? else {
        return Err(ApiError::new(ErrorCode::NotFound, "no parked row with this id"));
    };
    tracing::warn!(consumer = %name, id, new_id, by = %scope, "parked outbox row retried by an operator");
    c.wake.notify_waiters();
    Ok(Json(ParkedRetried { id, new_id }).into_response())
}
