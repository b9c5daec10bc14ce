//! How many file descriptors a generated Squid may use (`max_filedescriptors`).
//!
//! Squid sets its own soft limit to this value (up to the hard limit it
//! inherits; where the hard limit is lower it logs an error and takes the
//! hard limit), and sizes its descriptor tables by it: unset, it takes the
//! limit it inherits, which in containers is often 1,048,576 and gets it
//! OOM-killed. Each relayed request holds two descriptors, and Squid stops
//! accepting (it does not exit) when it runs out, so the value is how many
//! idle connections a stranger must hold open to starve other clients:
//! 16,384 lets ~8,000 requests through at once. Measured with Squid 5.7:
//! ~2 MB more at start than 4,096, and ~6 KB per open connection with a
//! partial request, so a full table stays around 125 MB — inside the
//! Kubernetes pods' 256 Mi limit.
pub const MAX_FILEDESCRIPTORS: u32 = 16_384;
