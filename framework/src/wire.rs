//! The names of the headers the framework writes on the records it produces: one place,
//! below every producer and reader of them.

/// Header naming the source record of an output record: `<topic>:<partition>:<offset>`.
pub const SOURCE_HEADER: &str = "lambda-streams-source";
/// Header carrying the version of the state item a table update comes from (decimal).
pub const VERSION_HEADER: &str = "lambda-streams-version";
/// Header of a record produced to a repartition topic: its rank among the records its
/// source record produced there (decimal, from 0).
pub const SEQUENCE_HEADER: &str = "lambda-streams-sequence";

/// Header of a dead-lettered record carrying the error that sent it there.
pub const ERROR_HEADER: &str = "lambda-streams-error";
