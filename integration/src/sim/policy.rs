//! The network-policy agent of a simulated node: the [`crate::npa`] stand-in started inside the
//! node's namespace, serving the socket the node's plugin dials ([`SimNode::npa_socket`]), its
//! state under the node's directory, its process in the run's PID list. Must not: start
//! anything outside the node's namespace.

use super::*;
use crate::npa::{NpaError, NpaOptions, NpaStandin};

impl Sim {
    /// Start node `i`'s network-policy agent stand-in (state in `<node dir>/npa`); it serves
    /// the node's `npaSocket` until dropped.
    pub fn start_npa(&self, i: usize) -> Result<NpaStandin, NpaError> {
        let node = &self.nodes[i];
        NpaStandin::start_with(
            &node.netns,
            &node.dir.join("npa"),
            &NpaOptions {
                socket: Some(node.npa_socket()),
                pids: Some(self.pid_list()),
                ..NpaOptions::default()
            },
        )
    }
}
