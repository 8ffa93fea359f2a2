//! Background jobs, one task per node each: the scheduler and the room
//! keeper.

pub(crate) mod room_keeper;
pub(crate) mod scheduler;
