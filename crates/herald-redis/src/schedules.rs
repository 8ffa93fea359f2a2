//! Scheduled delivery on Redis.

use std::time::Duration;

use herald_core::{AppendRequest, Claim, Delivered, EngineError, Schedule, ScheduleReceipt, ScheduleRequest};
use herald_proto::ChannelName;

use crate::ops::Inner;

fn unsupported() -> EngineError {
    EngineError::Unavailable("scheduled delivery is not implemented on the redis engine yet".into())
}

impl Inner {
    pub async fn schedule(&self, _req: ScheduleRequest) -> Result<ScheduleReceipt, EngineError> {
        Err(unsupported())
    }
    pub async fn scheduled(&self, _ch: &ChannelName, _limit: usize) -> Result<Vec<Schedule>, EngineError> {
        Err(unsupported())
    }
    pub async fn schedule_cancel(&self, _id: &str) -> Result<Option<Schedule>, EngineError> {
        Err(unsupported())
    }
    pub async fn schedules_claim(
        &self,
        _now: u64,
        _limit: usize,
        _lease: Duration,
    ) -> Result<Vec<Claim>, EngineError> {
        Err(unsupported())
    }
    pub async fn schedule_deliver(
        &self,
        _claim: &Claim,
        _req: AppendRequest,
    ) -> Result<Delivered, EngineError> {
        Err(unsupported())
    }
    pub async fn schedule_next(&self) -> Result<Option<u64>, EngineError> {
        Ok(None)
    }
    pub async fn schedules_pending(&self) -> Result<u64, EngineError> {
        Ok(0)
    }
}
