//! Every kind of write the writer takes, in one list.
//!
//! Adding a kind of write is its module (the request type and its
//! [`Stage`] impl side by side) and one line in the `requests!` list below; the
//! engine submits it with `submit(write)`, and the writer stages, answers
//! and fails it without knowing which kind it is.

use herald_core::{
    AppendRequest, CursorAck, LeaseJoin, LeaseLeave, LeaseRejoin, LeaseRenew, RoomWrite, ScheduleRequest,
};

use crate::append::AppendBatch;
use crate::stage::{Req, Staging};
use crate::storage::StorageError;
use crate::writer::Writer;
use crate::{control, presence, schedules};

/// Declares [`Request`] with one arm per kind, `From<Req<kind>>` for each
/// (how the engine queues a kind), and the dispatch to [`Req`].
macro_rules! requests {
    ($($(#[$doc:meta])* $arm:ident($kind:ty),)*) => {
        /// What the writer's queue carries: a write with its caller's reply,
        /// or the close.
        pub(crate) enum Request {
            $($(#[$doc])* $arm(Req<$kind>),)*
            /// Stop accepting, finish what is queued, persist, exit.
            Close,
        }

        $(impl From<Req<$kind>> for Request {
            fn from(req: Req<$kind>) -> Self {
                Request::$arm(req)
            }
        })*

        impl Request {
            /// How many requests this counts for in a batch (none for the
            /// close).
            pub fn requests(&self) -> usize {
                match self {
                    $(Request::$arm(req) => req.requests(),)*
                    Request::Close => 0,
                }
            }

            pub fn stage(&mut self, w: &mut Writer, st: &mut Staging) -> Result<(), StorageError> {
                match self {
                    $(Request::$arm(req) => req.stage(w, st),)*
                    Request::Close => Ok(()),
                }
            }

            pub fn answer(self) {
                match self {
                    $(Request::$arm(req) => req.answer(),)*
                    Request::Close => {}
                }
            }

            pub fn fail(self, reason: &str) {
                match self {
                    $(Request::$arm(req) => req.fail(reason),)*
                    Request::Close => {}
                }
            }
        }
    };
}

requests! {
    Append(AppendRequest),
    /// Several appends of one caller, in order: one queue hand-off, staged
    /// one after the other into the same group commit (the batch may then
    /// exceed `max_batch` by its length), answered with one reply (one
    /// wake-up of the caller).
    AppendBatch(AppendBatch),
    Ack(CursorAck),
    PresenceJoin(LeaseJoin),
    PresenceRenew(LeaseRenew),
    PresenceLeave(LeaseLeave),
    PresenceRejoin(LeaseRejoin),
    PresenceExpire(presence::Expire),
    RoomWrite(RoomWrite),
    ScheduleAdd(ScheduleRequest),
    ScheduleCancel(schedules::Cancel),
    ScheduleDeliver(schedules::Deliver),
    ControlRaise(control::Raise),
}
