//! The Herald wire contract: WebSocket frames, HTTP bodies, error codes and
//! channel names.
//!
//! This crate is pure data and (de)serialisation. It must never do IO, depend
//! on tokio, or know about storage. Every wire-visible string (frame types,
//! error codes, close codes) is defined here once; the server maps them to
//! HTTP statuses and close frames through [`ErrorCode`].

mod channel;
mod code;
mod frame;

pub use channel::{ChannelName, ChannelNameError, MAX_CHANNEL_LEN};
pub use code::{close, ErrorCode, Problem};
pub use frame::{
    encode_frame, encode_message_frame, encode_pong, encode_unsubscribed, mark_redelivered,
    validate_client_id, validate_meta, ClientFrame, ClientFrameError, DisconnectFrame, ErrorFrame, FrameKind,
    Member, MessageView, Meta, OkFrame, Since, MAX_CLIENT_ID_LEN, MAX_MEMBER_INFO_LEN, MAX_META_ENTRIES,
    MAX_META_VALUE_LEN,
};
