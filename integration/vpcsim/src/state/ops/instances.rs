//! Instance lifecycle: `RunInstances` (with its primary ENI) and `TerminateInstances`. Must not
//! know HTTP or knobs.

use super::super::{Instance, InstanceState, Now, State, StateError};
use super::{CreateEni, RunInstances, TerminatedInstance};
use crate::limits;

impl State {
    /// `RunInstances`: instances with a primary ENI at device index 0 (deleted on termination).
    pub fn run_instances(
        &mut self,
        req: RunInstances,
        now: Now,
    ) -> Result<Vec<String>, StateError> {
        if limits::lookup(&req.instance_type).is_none() {
            return Err(StateError::InvalidParameterValue(format!(
                "invalid value '{}' for InstanceType",
                req.instance_type
            )));
        }
        if req.count == 0 {
            return Err(StateError::InvalidParameterValue(
                "MinCount and MaxCount must be at least 1".into(),
            ));
        }
        let subnet_id = match req.subnet_id {
            Some(s) => s,
            None => self
                .default_subnet()
                .map(|s| s.id.clone())
                .ok_or_else(|| StateError::MissingParameter("SubnetId".into()))?,
        };
        // Validate on a copy, so a failure midway leaves no half-launched instances.
        let mut next = self.clone();
        let mut ids = Vec::new();
        for _ in 0..req.count {
            let eni_id = next.create_eni(CreateEni {
                subnet_id: subnet_id.clone(),
                groups: req.groups.clone(),
                ipv6_count: req.ipv6_count,
                ..CreateEni::default()
            })?;
            let id = next.mint("i");
            next.instances.insert(
                id.clone(),
                Instance {
                    id: id.clone(),
                    instance_type: req.instance_type.clone(),
                    subnet_id: subnet_id.clone(),
                    availability_zone: next.subnet_az(&subnet_id).to_owned(),
                    state: InstanceState::Running,
                    launch_time: now.wall,
                    primary_eni: eni_id.clone(),
                    tags: req.tags.clone(),
                },
            );
            next.attach_eni(&eni_id, &id, 0, now)?;
            if let Some(a) = next
                .enis
                .get_mut(&eni_id)
                .and_then(|e| e.attachment.as_mut())
            {
                a.delete_on_termination = true;
            }
            ids.push(id);
        }
        *self = next;
        Ok(ids)
    }

    /// `TerminateInstances`: ENIs are detached; those with DeleteOnTermination are deleted.
    pub fn terminate_instances(
        &mut self,
        ids: &[String],
    ) -> Result<Vec<TerminatedInstance>, StateError> {
        for id in ids {
            self.instance(id)?;
        }
        let mut out = Vec::new();
        for id in ids {
            let previous = self.instances[id].state;
            let attached: Vec<(String, bool)> = self
                .enis_of(id)
                .iter()
                .map(|e| {
                    (
                        e.id.clone(),
                        e.attachment
                            .as_ref()
                            .is_some_and(|a| a.delete_on_termination),
                    )
                })
                .collect();
            for (eni_id, delete) in attached {
                if delete {
                    self.enis.remove(&eni_id);
                } else if let Some(e) = self.enis.get_mut(&eni_id) {
                    e.attachment = None;
                }
            }
            self.prune_associations();
            if let Some(inst) = self.instances.get_mut(id) {
                inst.state = InstanceState::Terminated;
            }
            out.push(TerminatedInstance {
                instance_id: id.clone(),
                previous,
                current: InstanceState::Terminated,
            });
        }
        Ok(out)
    }
}
