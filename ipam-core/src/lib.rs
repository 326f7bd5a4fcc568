//! The pure core of L-IPAMD, a crate of its own so the compiler keeps it below the daemon:
//! the address datastore and its checkpoint format (`datastore`), the warm-pool policy, the
//! reconcile plan and the EC2-shaped port the pool is executed through (`pool`). Must not:
//! depend on the daemon (`ipamd`), an async runtime, EC2, the kernel or Kubernetes; the only
//! I/O is the checkpoint file behind its port.

pub mod datastore;
pub mod pool;
