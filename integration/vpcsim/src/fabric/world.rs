//! The fabric's view of the simulated EC2 world: `FabricWorld` for `Arc<World>`. Must not add
//! behaviour; it only forwards to the world's contract.

use std::sync::Arc;

use super::FabricWorld;
use crate::view::FabricView;
use crate::world::World;

impl FabricWorld for Arc<World> {
    fn fabric_view(&self) -> FabricView {
        World::fabric_view(self, self.now())
    }

    fn imds_router(&self, instance_id: &str) -> axum::Router {
        crate::imds::router(self.clone(), instance_id)
    }

    fn ec2_router(&self) -> axum::Router {
        crate::ec2::router(self.clone())
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.subscribe())
    }
}
