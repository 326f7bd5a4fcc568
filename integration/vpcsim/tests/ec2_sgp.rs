//! Security groups for pods on the simulator's EC2 API, driven by aws-sdk-ec2 as the VPC
//! Resource Controller drives EC2: a trunk ENI (`InterfaceType=trunk`) attached to a
//! trunking-capable node, branch ENIs with their own security groups associated on VLANs
//! (`AssociateTrunkInterface`, `DescribeTrunkInterfaceAssociations`,
//! `DisassociateTrunkInterface`), the per-type limits, security groups with rules, and the
//! `FabricView` the fabric reconciles (trunk's `interface_type`, `branches`, groups' rules).
// Integration tests are their own crate; the workspace lint targets unit tests in src/.
#![allow(clippy::tests_outside_test_module)]

use crate::common;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    Filter, InstanceType, IpPermission, IpRange, NetworkInterfaceCreationType, UserIdGroupPair,
};
use std::sync::Arc;
use vpcsim::{World, WorldConfig};

struct Sim {
    world: Arc<World>,
    ec2: Client,
    _server: vpcsim::LocalServer,
}

async fn sim() -> Sim {
    let world = World::new(WorldConfig::default());
    let server = vpcsim::LocalServer::start(vpcsim::ec2::router(world.clone()))
        .await
        .unwrap();
    let conf = common::ec2_config(server.addr(), "AKIDSGP")
        .retry_config(RetryConfig::disabled())
        .build();
    Sim {
        world,
        ec2: Client::from_conf(conf),
        _server: server,
    }
}

fn code<E: ProvideErrorMetadata, R>(
    r: Result<R, aws_sdk_ec2::error::SdkError<E, aws_sdk_ec2::config::http::HttpResponse>>,
) -> String {
    match r {
        Ok(_) => "<success>".into(),
        Err(e) => e.code().unwrap_or("<no code>").to_owned(),
    }
}

impl Sim {
    async fn run(&self, t: InstanceType) -> String {
        let out = self
            .ec2
            .run_instances()
            .instance_type(t)
            .min_count(1)
            .max_count(1)
            .send()
            .await
            .unwrap();
        out.instances()[0].instance_id().unwrap().to_owned()
    }

    fn subnet(&self) -> String {
        self.world.read(|s| s.default_subnet().unwrap().id.clone())
    }

    async fn create(&self, trunk: bool, groups: &[&str]) -> String {
        let mut req = self
            .ec2
            .create_network_interface()
            .subnet_id(self.subnet())
            .description(if trunk { "trunk-eni" } else { "branch-eni" });
        if trunk {
            req = req.interface_type(NetworkInterfaceCreationType::Trunk);
        }
        for g in groups {
            req = req.groups(*g);
        }
        let out = req.send().await.unwrap();
        let eni = out.network_interface().unwrap();
        assert_eq!(
            eni.interface_type().map(|t| t.as_str()),
            Some(if trunk { "trunk" } else { "interface" })
        );
        eni.network_interface_id().unwrap().to_owned()
    }

    async fn attach(&self, eni: &str, inst: &str, idx: i32) -> String {
        code(
            self.ec2
                .attach_network_interface()
                .network_interface_id(eni)
                .instance_id(inst)
                .device_index(idx)
                .send()
                .await,
        )
    }

    async fn associate(&self, branch: &str, trunk: &str, vlan: i32) -> Result<String, String> {
        self.ec2
            .associate_trunk_interface()
            .branch_interface_id(branch)
            .trunk_interface_id(trunk)
            .vlan_id(vlan)
            .send()
            .await
            .map(|o| {
                let a = o.interface_association().unwrap();
                assert_eq!(a.branch_interface_id(), Some(branch));
                assert_eq!(a.trunk_interface_id(), Some(trunk));
                assert_eq!(a.vlan_id(), Some(vlan));
                assert_eq!(a.interface_protocol().map(|p| p.as_str()), Some("VLAN"));
                a.association_id().unwrap().to_owned()
            })
            .map_err(|e| e.code().unwrap_or("<no code>").to_owned())
    }
}

#[tokio::test]
async fn trunk_and_branches_on_the_ec2_api_and_in_the_fabric_view() {
    let s = sim().await;
    let node = s.run(InstanceType::M5Large).await;
    let small = s.run(InstanceType::T3Medium).await;
    let trunk = s.create(true, &[]).await;
    // t3.medium is not trunking compatible (the controller's limits table).
    assert_eq!(s.attach(&trunk, &small, 1).await, "InvalidParameterValue");
    assert_eq!(s.attach(&trunk, &node, 1).await, "<success>");
    // One trunk per instance.
    let second = s.create(true, &[]).await;
    assert_eq!(s.attach(&second, &node, 2).await, "InvalidParameterValue");

    let pods_sg = s.world.read(|w| {
        w.security_groups
            .values()
            .find(|g| g.name == "pods")
            .unwrap()
            .id
            .clone()
    });
    let branch = s.create(false, &[&pods_sg]).await;
    // Not on a non-trunk, not without a VLAN id, not on VLAN 0.
    let plain = s.create(false, &[]).await;
    assert_eq!(
        s.associate(&branch, &plain, 1).await.unwrap_err(),
        "InvalidParameterValue"
    );
    assert_eq!(
        code(
            s.ec2
                .associate_trunk_interface()
                .branch_interface_id(&branch)
                .trunk_interface_id(&trunk)
                .send()
                .await
        ),
        "MissingParameter"
    );
    assert_eq!(
        s.associate(&branch, &trunk, 0).await.unwrap_err(),
        "InvalidParameterValue"
    );
    let assoc = s.associate(&branch, &trunk, 1).await.unwrap();
    // The same branch twice, another branch on a used VLAN.
    assert_eq!(
        s.associate(&branch, &trunk, 2).await.unwrap_err(),
        "InvalidNetworkInterface.InUse"
    );
    let other = s.create(false, &[]).await;
    assert_eq!(
        s.associate(&other, &trunk, 1).await.unwrap_err(),
        "InvalidParameterValue"
    );
    // A branch is never attached.
    assert_eq!(
        s.attach(&branch, &node, 2).await,
        "InvalidNetworkInterface.InUse"
    );

    // Described: the trunk as trunk, the branch as branch (with its own groups).
    let d = s
        .ec2
        .describe_network_interfaces()
        .network_interface_ids(&trunk)
        .network_interface_ids(&branch)
        .send()
        .await
        .unwrap();
    let ty = |id: &str| {
        d.network_interfaces()
            .iter()
            .find(|e| e.network_interface_id() == Some(id))
            .and_then(|e| e.interface_type())
            .map(|t| t.as_str().to_owned())
    };
    assert_eq!(ty(&trunk).as_deref(), Some("trunk"));
    assert_eq!(ty(&branch).as_deref(), Some("branch"));
    let by_trunk = s
        .ec2
        .describe_trunk_interface_associations()
        .filters(
            Filter::builder()
                .name("trunk-interface-association.trunk-interface-id")
                .values(&trunk)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let ids: Vec<&str> = by_trunk
        .interface_associations()
        .iter()
        .filter_map(|a| a.association_id())
        .collect();
    assert_eq!(ids, [assoc.as_str()]);
    assert_eq!(
        code(
            s.ec2
                .describe_trunk_interface_associations()
                .association_ids("trunk-assoc-0000000000000000f")
                .send()
                .await
        ),
        "InvalidAssociationID.NotFound"
    );

    // The fabric's contract: the trunk's type and its branches with VLAN, MAC, address,
    // subnet and groups.
    let view = s.world.fabric_view(std::time::Instant::now());
    let inst = view.instance(&node).unwrap();
    let t = inst.enis.iter().find(|e| e.eni_id == trunk).unwrap();
    assert_eq!(t.interface_type, "trunk");
    assert_eq!(t.branches.len(), 1);
    let b = &t.branches[0];
    let (mac, ip) = s.world.read(|w| {
        let e = &w.enis[&branch];
        (e.mac.clone(), e.private_ips[0])
    });
    assert_eq!(
        (b.eni_id.as_str(), b.vlan_id, b.mac.as_str(), b.primary_ip),
        (branch.as_str(), 1, mac.as_str(), ip)
    );
    assert_eq!(b.security_groups, std::slice::from_ref(&pods_sg));
    assert!(b.subnet_cidr.contains(&b.primary_ip));
    assert!(
        !inst.enis.iter().any(|e| e.eni_id == branch),
        "a branch is not an ENI of the instance"
    );

    // Disassociate, then delete: nothing left on the trunk.
    s.ec2
        .disassociate_trunk_interface()
        .association_id(&assoc)
        .send()
        .await
        .unwrap();
    assert_eq!(
        code(
            s.ec2
                .disassociate_trunk_interface()
                .association_id(&assoc)
                .send()
                .await
        ),
        "InvalidAssociationID.NotFound"
    );
    let again = s.associate(&branch, &trunk, 7).await.unwrap();
    s.ec2
        .delete_network_interface()
        .network_interface_id(&branch)
        .send()
        .await
        .unwrap();
    let left = s.world.read(|w| w.trunk_associations.contains_key(&again));
    assert!(!left, "deleting a branch removes its association");
    let view = s.world.fabric_view(std::time::Instant::now());
    let t = view
        .instance(&node)
        .unwrap()
        .enis
        .iter()
        .find(|e| e.eni_id == trunk)
        .unwrap()
        .clone();
    assert!(t.branches.is_empty());
}

#[tokio::test]
async fn branch_limit_per_instance_type() {
    let s = sim().await;
    let node = s.run(InstanceType::M5Large).await; // 9 branches (controller's table)
    let trunk = s.create(true, &[]).await;
    assert_eq!(s.attach(&trunk, &node, 1).await, "<success>");
    for vlan in 1..=9 {
        let b = s.create(false, &[]).await;
        s.associate(&b, &trunk, vlan).await.unwrap();
    }
    let b = s.create(false, &[]).await;
    assert_eq!(
        s.associate(&b, &trunk, 10).await.unwrap_err(),
        "AttachmentLimitExceeded"
    );
    // Terminating the node (trunk deleted on termination) drops the associations.
    s.world
        .mutate(|w, _| {
            let a = w.enis[&trunk].attachment.clone().unwrap().id;
            w.modify_eni(
                &trunk,
                vpcsim::state::ModifyEni {
                    delete_on_termination: Some((a, true)),
                    ..Default::default()
                },
            )
        })
        .unwrap();
    s.ec2
        .terminate_instances()
        .instance_ids(&node)
        .send()
        .await
        .unwrap();
    assert!(s.world.read(|w| w.trunk_associations.is_empty()));
}

#[tokio::test]
async fn security_groups_with_rules_reach_the_fabric_view() {
    let s = sim().await;
    let vpc = s.world.read(|w| w.vpc.id.clone());
    let db = s
        .ec2
        .create_security_group()
        .group_name("db-clients")
        .description("pods that may reach the database")
        .vpc_id(&vpc)
        .send()
        .await
        .unwrap()
        .group_id()
        .unwrap()
        .to_owned();
    assert_eq!(
        code(
            s.ec2
                .create_security_group()
                .group_name("db-clients")
                .description("again")
                .vpc_id(&vpc)
                .send()
                .await
        ),
        "InvalidGroup.Duplicate"
    );
    let tcp = |port: i32| {
        IpPermission::builder()
            .ip_protocol("tcp")
            .from_port(port)
            .to_port(port)
    };
    s.ec2
        .authorize_security_group_ingress()
        .group_id(&db)
        .ip_permissions(
            tcp(5432)
                .ip_ranges(IpRange::builder().cidr_ip("203.0.113.0/24").build())
                .user_id_group_pairs(UserIdGroupPair::builder().group_id(&db).build())
                .build(),
        )
        .send()
        .await
        .unwrap();
    // Egress: replace EC2's allow-all with one port.
    s.ec2
        .revoke_security_group_egress()
        .group_id(&db)
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("-1")
                .ip_ranges(IpRange::builder().cidr_ip("0.0.0.0/0").build())
                .ipv6_ranges(
                    aws_sdk_ec2::types::Ipv6Range::builder()
                        .cidr_ipv6("::/0")
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    s.ec2
        .authorize_security_group_egress()
        .group_id(&db)
        .ip_permissions(
            tcp(53)
                .ip_ranges(IpRange::builder().cidr_ip("198.18.0.2/32").build())
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        code(
            s.ec2
                .authorize_security_group_ingress()
                .group_id(&db)
                .ip_permissions(
                    tcp(1)
                        .user_id_group_pairs(
                            UserIdGroupPair::builder()
                                .group_id("sg-0000000000000fffff")
                                .build()
                        )
                        .build()
                )
                .send()
                .await
        ),
        "InvalidGroup.NotFound"
    );
    let d = s
        .ec2
        .describe_security_groups()
        .group_ids(&db)
        .send()
        .await
        .unwrap();
    let g = &d.security_groups()[0];
    let ingress = &g.ip_permissions()[0];
    assert_eq!(
        (
            ingress.ip_protocol(),
            ingress.from_port(),
            ingress.to_port()
        ),
        (Some("tcp"), Some(5432), Some(5432))
    );
    assert_eq!(ingress.ip_ranges()[0].cidr_ip(), Some("203.0.113.0/24"));
    assert_eq!(
        ingress.user_id_group_pairs()[0].group_id(),
        Some(db.as_str())
    );
    assert_eq!(g.ip_permissions_egress().len(), 1);

    let view = s.world.fabric_view(std::time::Instant::now());
    let v = view
        .security_groups
        .iter()
        .find(|v| v.group_id == db)
        .unwrap();
    assert_eq!(v.ingress.len(), 1);
    assert_eq!(v.ingress[0].protocol, "tcp");
    assert_eq!(v.ingress[0].from_port, Some(5432));
    assert_eq!(
        v.ingress[0].cidrs,
        ["203.0.113.0/24".parse::<ipnet::IpNet>().unwrap()]
    );
    assert_eq!(v.ingress[0].groups, std::slice::from_ref(&db));
    assert_eq!(v.egress.len(), 1);
    assert_eq!(v.egress[0].to_port, Some(53));
    // The VPC's default group lets its members in and everything out.
    let default = view
        .security_groups
        .iter()
        .find(|v| {
            s.world
                .read(|w| w.security_groups[&v.group_id].name == "default")
        })
        .unwrap();
    assert_eq!(
        default.ingress[0].groups,
        std::slice::from_ref(&default.group_id)
    );
    assert_eq!(default.egress[0].protocol, "-1");
}
