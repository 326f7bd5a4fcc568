//! ipamd library: the composition root and the daemon's modules.
