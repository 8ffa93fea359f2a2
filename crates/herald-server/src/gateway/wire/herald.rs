//! Herald's JSON wire (`/ws`, docs/protocol.md): one JSON object per text
//! frame; live messages go out as their stored frame, unchanged.

use herald_core::Receipt;
use herald_proto::{ChannelName, ClientFrame, DisconnectFrame, ErrorCode, OkFrame};
use tokio_websockets::Message as WsMessage;

use super::Command;
use crate::error::ApiError;

/// The command of a data frame: a text frame parsed, a binary one refused.
pub(super) fn decode(msg: &WsMessage) -> Command {
    match msg.as_text() {
        Some(text) => Command::Herald(ClientFrame::parse(text)),
        None => {
            let err = ApiError::new(ErrorCode::BadRequest, "binary frames are not supported; send JSON text");
            Command::Refuse { reply: Some(err.frame(None, None)), reason: "binary frame" }
        }
    }
}

/// The `ok` reply to a publish the engine took, appended to `out`.
pub(super) fn push_published(out: &mut Vec<u8>, req: Option<u64>, channel: &ChannelName, receipt: &Receipt) {
    OkFrame::push_published(out, req, channel.as_str(), receipt.seq, &receipt.id, receipt.duplicate);
}

/// The `disconnect` frame sent before a close.
pub(super) fn disconnect(code: u16, reason: &str, reconnect: bool) -> Vec<u8> {
    DisconnectFrame { code, reason: reason.to_owned(), reconnect }.encode()
}
