//! Pods of a [`Sim`] and the address assertions: pod namespaces wired by `aws-cni` ADD/DEL as
//! a CNI runtime would, and the checks that every pod address is unique, owned in EC2 by an ENI
//! of its node and listed by ipamd. Must not touch namespaces other than the run's.

use super::*;

/// Every ENI of every card in a `/v1/enis` answer (upstream's shape: card index → `ENIs`).
fn enis_of_every_card(v: &serde_json::Value) -> Result<Vec<(&String, &serde_json::Value)>, String> {
    let cards = v.as_object().ok_or("/v1/enis: not an object")?;
    Ok(cards
        .values()
        .filter_map(|card| card.get("ENIs").and_then(|e| e.as_object()))
        .flat_map(|enis| enis.iter())
        .collect())
}

impl Sim {
    /// Assigned addresses in node `i`'s `/v1/enis`: address → (ENI id, pod name from metadata).
    pub fn assigned(&self, i: usize) -> Result<BTreeMap<Ipv4Addr, (String, String)>, String> {
        let v = self.introspect(i, "/v1/enis")?;
        let mut out = BTreeMap::new();
        for (eni_id, eni) in enis_of_every_card(&v)? {
            {
                let Some(cidrs) = eni.get("AvailableIPv4Cidrs").and_then(|c| c.as_object()) else {
                    continue;
                };
                for cidr in cidrs.values() {
                    let Some(addrs) = cidr.get("IPAddresses").and_then(|a| a.as_object()) else {
                        continue;
                    };
                    for (ip, info) in addrs {
                        let net = info["IPAMKey"]["networkName"].as_str().unwrap_or("");
                        if net.is_empty() {
                            continue;
                        }
                        let pod = info["IPAMMetadata"]["k8sPodName"]
                            .as_str()
                            .unwrap_or("")
                            .to_owned();
                        let ip: Ipv4Addr = ip.parse().map_err(|e| format!("{ip}: {e}"))?;
                        if out.insert(ip, (eni_id.clone(), pod)).is_some() {
                            return Err(format!("{ip} listed twice in /v1/enis"));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every live pod's address is unique across the VPC, owned in EC2 by an ENI of its node,
    /// and listed as assigned to that pod in its node's `/v1/enis`, which assigns nothing else.
    pub fn check_addresses(&self) -> Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for p in self.pods.iter().filter(|p| !p.ip.is_unspecified()) {
            if !seen.insert(p.ip) {
                return Err(format!("duplicate pod address {}", p.ip));
            }
            if self.eni_of(p.node, p.ip).is_none() {
                return Err(format!(
                    "{} ({}) is not assigned to any ENI of node {} in EC2",
                    p.name, p.ip, p.node
                ));
            }
        }
        for i in 0..self.nodes.len() {
            let got: BTreeMap<Ipv4Addr, String> = self
                .assigned(i)?
                .into_iter()
                .map(|(ip, (_, pod))| (ip, pod))
                .collect();
            let want: BTreeMap<Ipv4Addr, String> = self
                .pods
                .iter()
                .filter(|p| p.node == i && !p.ip.is_unspecified())
                .map(|p| (p.ip, p.name.clone()))
                .collect();
            if got != want {
                return Err(format!(
                    "node {i}: /v1/enis assignments differ from live pods\n  ipamd: {got:?}\n  pods:  {want:?}"
                ));
            }
        }
        Ok(())
    }

    /// EC2's view of node `i`: ENI id → (device index, secondary IPs).
    #[must_use]
    pub fn ec2_enis(&self, i: usize) -> BTreeMap<String, (u32, Vec<Ipv4Addr>)> {
        let id = self.nodes[i].instance_id.clone();
        self.world.read(|s| {
            s.enis_of(&id)
                .into_iter()
                .map(|e| {
                    let dev = e.attachment.as_ref().map_or(u32::MAX, |a| a.device_index);
                    (
                        e.id.clone(),
                        (dev, e.private_ips.iter().skip(1).copied().collect()),
                    )
                })
                .collect()
        })
    }

    /// Every address node `i`'s ipamd holds in its pools (`/v1/enis`, every card, free or
    /// assigned, each CIDR expanded), with its ENI.
    pub fn pool_addresses(&self, i: usize) -> Result<BTreeMap<Ipv4Addr, String>, String> {
        let v = self.introspect(i, "/v1/enis")?;
        let mut out = BTreeMap::new();
        for (eni, e) in enis_of_every_card(&v)? {
            {
                let Some(cidrs) = e.get("AvailableIPv4Cidrs").and_then(|c| c.as_object()) else {
                    continue;
                };
                for cidr in cidrs.keys() {
                    let net: ipnet::Ipv4Net = cidr.parse().map_err(|e| format!("{cidr}: {e}"))?;
                    for ip in net.hosts().chain([net.network()]) {
                        out.insert(ip, eni.clone());
                    }
                }
            }
        }
        Ok(out)
    }

    /// Which node's ENI EC2 has each secondary address on now (the state itself, not a lagging
    /// Describe).
    #[must_use]
    pub fn ec2_owners(&self) -> BTreeMap<Ipv4Addr, usize> {
        (0..self.nodes.len())
            .flat_map(|i| {
                self.ec2_enis(i)
                    .into_values()
                    .flat_map(move |(_, ips)| ips.into_iter().map(move |ip| (ip, i)))
            })
            .collect()
    }

    /// The addresses node `i`'s ipamd holds in its pools that EC2 has on another node's ENI
    /// (it could hand one to a pod while the other node does too), with that node.
    pub fn foreign_in_pool(&self, i: usize) -> Result<Vec<(Ipv4Addr, usize)>, String> {
        let owners = self.ec2_owners();
        Ok(self
            .pool_addresses(i)?
            .keys()
            .filter_map(|ip| owners.get(ip).filter(|o| **o != i).map(|o| (*ip, *o)))
            .collect())
    }

    /// The ENI (id) that EC2 says owns `ip` on node `i`, if any.
    #[must_use]
    pub fn eni_of(&self, i: usize, ip: Ipv4Addr) -> Option<String> {
        let view = World::fabric_view(&self.world, self.world.now());
        view.instance(&self.nodes[i].instance_id)?
            .enis
            .iter()
            .find(|e| e.owns_ipv4(ip))
            .map(|e| e.eni_id.clone())
    }

    /// Create a pod namespace below node `node` and wire it with `aws-cni` ADD (the node's
    /// whole chain once it has a conflist, [`Sim::install_conflist`]). On failure the
    /// namespace is removed again and the plugin's error is returned.
    pub fn add_pod(&mut self, node: usize, name: &str) -> Result<Pod, CniFailure> {
        self.pod_seq += 1;
        let netns = format!("{}p{}", self.prefix(), self.pod_seq);
        if let Err(output) = crate::supervisor::add_netns(&netns) {
            delete_netns(&netns);
            return Err(CniFailure { code: -1, output });
        }
        self.add_pod_in(node, name, netns)
    }

    /// [`Sim::add_pod`] into a namespace the caller made ([`Sim::new_pod_netns`]), e.g. to
    /// watch it while ADD runs. On failure the namespace is removed.
    pub fn add_pod_in(
        &mut self,
        node: usize,
        name: &str,
        netns: String,
    ) -> Result<Pod, CniFailure> {
        self.pod_seq += 1;
        let container_id = format!("{:016x}{:08x}", self.pod_seq, std::process::id());
        let sandbox = Sandbox {
            pod_name: name,
            container_id: &container_id,
            netns: &netns,
        };
        match self.pod_cni("ADD", sandbox, node, None) {
            Ok(result) => {
                let ips: Vec<std::net::IpAddr> = result["ips"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c["address"].as_str())
                    .filter_map(|a| a.split('/').next()?.parse().ok())
                    .collect();
                let ip = ips.iter().find_map(|a| match a {
                    std::net::IpAddr::V4(v4) => Some(*v4),
                    std::net::IpAddr::V6(_) => None,
                });
                let ipv6 = ips.iter().find_map(|a| match a {
                    std::net::IpAddr::V6(v6) => Some(*v6),
                    std::net::IpAddr::V4(_) => None,
                });
                if ip.is_none() && ipv6.is_none() {
                    // the namespace goes; the caller can still DEL with the result
                    delete_netns(&netns);
                    return Err(CniFailure {
                        code: 0,
                        output: format!("no address in result: {result}"),
                    });
                }
                let pod = Pod {
                    name: name.to_owned(),
                    node,
                    netns,
                    container_id,
                    ip: ip.unwrap_or(Ipv4Addr::UNSPECIFIED),
                    ipv6,
                    result,
                };
                self.pods.push(pod.clone());
                Ok(pod)
            }
            Err(e) => {
                delete_netns(&netns);
                Err(e)
            }
        }
    }

    /// `aws-cni` DEL (the chain's, in reverse order, once the node has a conflist) for `pod`
    /// with its ADD result as prevResult, then delete its namespace.
    pub fn del_pod(&mut self, pod: &Pod) -> Result<(), CniFailure> {
        let r = self.pod_cni("DEL", pod.sandbox(), pod.node, Some(&pod.result));
        delete_netns(&pod.netns);
        self.pods.retain(|p| p.netns != pod.netns);
        r.map(drop)
    }

    /// Pod-related state left in node `i`: veths (`aws-cni`'s `eni*`, egress-cni's `veth*`),
    /// pod rules 512/1536 and routes via those veths in both families, egress-cni's `CNI-E4-*`
    /// / `CNI-E6-*` nat chains and its host-local leases.
    #[must_use]
    pub fn pod_leftovers(&self, i: usize) -> Vec<String> {
        let ns = &self.nodes[i].netns;
        let lines = |args: &[&str]| -> Vec<String> {
            let mut full = vec!["-n", ns.as_str()];
            full.extend_from_slice(args);
            let out = Command::new("ip").args(&full).output();
            out.map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                    .collect()
            })
            .unwrap_or_default()
        };
        let mut left: Vec<String> = lines(&["-o", "link", "show", "type", "veth"])
            .into_iter()
            .filter(|l| l.contains(": eni") || l.contains(": veth"))
            .collect();
        for fam in ["-4", "-6"] {
            left.extend(
                lines(&[fam, "rule", "show"])
                    .into_iter()
                    .filter(|l| l.starts_with("512:") || l.starts_with("1536:")),
            );
            left.extend(
                lines(&[fam, "route", "show", "table", "all"])
                    .into_iter()
                    .filter(|l| l.contains(" dev eni") || l.contains(" dev veth")),
            );
        }
        if self.nodes[i].conflist.is_some() {
            for tool in ["iptables", "ip6tables"] {
                let out = exec_in(ns, &[tool, "-w", "-t", "nat", "-S"]);
                left.extend(
                    String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .filter(|l| l.contains("CNI-E4-") || l.contains("CNI-E6-"))
                        .map(|l| format!("{tool}: {l}")),
                );
            }
            left.extend(
                self.egress_leases(i)
                    .into_iter()
                    .map(|l| format!("egress lease {l}")),
            );
        }
        left
    }
}
