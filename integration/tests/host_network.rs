//! Kernel tests of ipamd's host networking (`ipamd::host`) in throwaway namespaces: ENI route
//! tables and rules, node rules, SNAT/connmark iptables chains (both backends, stale layouts,
//! idempotency), SNAT seen from a peer, and the plugins' IPv6 duplicate address detection wait. Every command and netlink socket is aimed at a
//! namespace created here (`hnt-<pid>-...`); nothing runs in the root namespace.

#[cfg(test)]
mod kernel {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
    use std::process::Command;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use dataplane::{MacAddr, NetNs};
    use integration::supervisor;
    use ipamd::host::{
        Backend, BackendChoice, EniPlanError, EniSpec, Exec, HostError, HostNetwork, NodeSpec,
        RandomizeSnat, RpFilter, SnatConfig,
    };

    const PREFIX: &str = "hnt-";
    static COUNTER: AtomicUsize = AtomicUsize::new(0);

    /// A namespace deleted on drop (also on panic). Stale ones of crashed runs are removed at
    /// creation by the shared supervisor: their name carries a pid that no longer exists.
    struct Ns {
        name: String,
    }

    impl Ns {
        fn new(tag: &str) -> Self {
            supervisor::remove_stale_netns(PREFIX);
            let name = format!(
                "{PREFIX}{}-{tag}{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::SeqCst)
            );
            supervisor::add_netns(&name).unwrap_or_else(|e| panic!("{e}"));
            Self { name }
        }

        /// Runs `argv` inside the namespace; panics on failure.
        fn exec(&self, argv: &[&str]) -> String {
            let mut full = vec!["ip", "netns", "exec", &self.name];
            full.extend_from_slice(argv);
            sh(&full)
        }

        fn ip(&self, args: &str) -> String {
            let mut full = vec!["ip", "-n", &self.name];
            full.extend(args.split_whitespace());
            sh(&full)
        }

        fn iptables_save(&self, backend: Backend) -> String {
            self.exec(&[backend.save_program()])
        }

        async fn host(&self, backend: BackendChoice) -> HostNetwork {
            let ns = NetNs::named(&self.name).expect("open test netns");
            let netlink = ns.connect().await.expect("netlink in test netns");
            HostNetwork::new(
                netlink,
                Arc::new(Exec::in_netns(&self.name)),
                Arc::new(ns),
                backend,
            )
        }
    }

    impl Drop for Ns {
        fn drop(&mut self) {
            supervisor::delete_netns(&self.name);
        }
    }

    fn sh(argv: &[&str]) -> String {
        let out = Command::new(argv[0])
            .args(&argv[1..])
            .output()
            .unwrap_or_else(|e| panic!("spawn {argv:?}: {e}"));
        assert!(
            out.status.success(),
            "{argv:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    const ENI_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0x01, 0x11]);
    const PRIMARY_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0x01, 0x01]);

    fn eni() -> EniSpec {
        EniSpec {
            mac: ENI_MAC,
            device_number: 1,
            network_card: 0,
            primary_ip: Ipv4Addr::new(198, 18, 1, 10),
            subnet: "198.18.1.0/24".parse().unwrap(),
            ipv6_routes: false,
        }
    }

    fn node_spec() -> NodeSpec {
        NodeSpec {
            primary_mac: PRIMARY_MAC,
            primary_ip: Ipv4Addr::new(198, 18, 0, 10),
            mtu: 9001,
            vpc_cidrs: vec!["198.18.0.0/16".parse().unwrap()],
            exclude_snat_cidrs: vec!["198.19.0.0/16".parse().unwrap()],
            external_snat: false,
            randomize_snat: RandomizeSnat::Prng,
            node_port_support: true,
            connmark: 0x80,
            veth_prefix: "eni".into(),
            external_service_cidrs: vec!["203.0.113.128/25".parse().unwrap()],
            ipv6: false,
            block_v6_egress_range: false,
        }
    }

    /// A veth "ENI" in `ns` named `name` with `mac`; its peer stays in `ns`, down.
    fn add_eni_link(ns: &Ns, name: &str, mac: MacAddr) {
        ns.ip(&format!(
            "link add {name} address {mac} mtu 1500 type veth peer name p{name}"
        ));
    }

    fn rules(ns: &Ns) -> String {
        ns.ip("-4 rule show")
    }

    #[tokio::test]
    async fn eni_setup_is_idempotent_and_teardown_removes_table_and_rules() {
        let ns = Ns::new("eni");
        add_eni_link(&ns, "eth1", ENI_MAC);
        let host = ns.host(BackendChoice::Auto).await;

        let applied = host.setup_eni(&eni(), 9001).await.unwrap();
        assert!(!applied.is_noop());

        let table = ns.ip("-4 route show table 2");
        assert!(table.contains("default via 198.18.1.1 dev eth1"), "{table}");
        assert!(table.contains("198.18.1.1 dev eth1 scope link"), "{table}");
        let link = ns.ip("link show dev eth1");
        assert!(link.contains("mtu 9001") && link.contains(",UP"), "{link}");
        assert!(ns.ip("-4 addr show dev eth1").contains("198.18.1.10/24"));
        let main = ns.ip("-4 route show table main");
        assert!(
            !main.contains("198.18.1.0/24"),
            "main-table subnet route left: {main}"
        );
        assert!(
            rules(&ns).contains("32765:\tfrom 198.18.1.10 lookup 2"),
            "{}",
            rules(&ns)
        );

        // Second run: nothing to do, nothing changed.
        let before = (rules(&ns), ns.ip("-4 route show table all"));
        assert!(host.setup_eni(&eni(), 9001).await.unwrap().is_noop());
        assert_eq!(before, (rules(&ns), ns.ip("-4 route show table all")));

        // A pod rule on this ENI's table, then the ENI is freed and its link detached.
        ns.ip("rule add from 198.18.1.77 lookup 2 pref 1536");
        ns.ip("link del eth1");
        let applied = host.teardown_eni(&eni()).await.unwrap();
        assert!(!applied.is_noop());
        let r = rules(&ns);
        assert!(!r.contains("lookup 2"), "{r}");
        assert!(ns.ip("-4 route show table 2").trim().is_empty());
        assert!(host.teardown_eni(&eni()).await.unwrap().is_noop());
    }

    #[tokio::test]
    async fn dual_stack_eni_table_routes_ipv6_via_the_vpc_router() {
        let ns = Ns::new("eni6");
        add_eni_link(&ns, "eth1", ENI_MAC);
        // IPv6 off on the link (as a `default/disable_ipv6=1` node whose init container did
        // not turn IPv6 on would create it): ipamd may not turn it on (its container's sysctl
        // tree is read-only, issue 37), so the set-up is refused, typed, and changes nothing.
        ns.exec(&["sysctl", "-q", "-w", "net.ipv6.conf.eth1.disable_ipv6=1"]);
        let host = ns.host(BackendChoice::Auto).await;
        let v6 = EniSpec {
            ipv6_routes: true,
            ..eni()
        };
        match host.setup_eni(&v6, 9001).await {
            Err(HostError::Eni(EniPlanError::Ipv6Disabled { link, value, .. })) => {
                assert_eq!((link.as_str(), value.as_str()), ("eth1", "1"));
            }
            other => panic!("expected Ipv6Disabled, got {other:?}"),
        }
        let disabled = ns.exec(&["sysctl", "-n", "net.ipv6.conf.eth1.disable_ipv6"]);
        assert_eq!(disabled.trim(), "1", "ipamd must not write disable_ipv6");
        let routes = ns.ip("route show table all");
        assert!(!routes.contains("table 2"), "nothing is set up: {routes}");

        // What the init container does with IPv6 on (aws-vpc-cni-init.sh): `all` (every
        // existing link) and `default` (links attached later) to 0; then the set-up goes on.
        ns.exec(&[
            "sysctl",
            "-q",
            "-w",
            "net.ipv6.conf.all.disable_ipv6=0",
            "net.ipv6.conf.default.disable_ipv6=0",
        ]);
        assert!(!host.setup_eni(&v6, 9001).await.unwrap().is_noop());
        let disabled = ns.exec(&["sysctl", "-n", "net.ipv6.conf.eth1.disable_ipv6"]);
        assert_eq!(disabled.trim(), "0");
        let table6 = ns.ip("-6 route show table 2");
        assert!(table6.contains("fe80:ec2::1 dev eth1"), "{table6}");
        assert!(
            table6.contains("default via fe80:ec2::1 dev eth1"),
            "{table6}"
        );
        // The IPv4 side as without IPv6.
        let table4 = ns.ip("-4 route show table 2");
        assert!(
            table4.contains("default via 198.18.1.1 dev eth1"),
            "{table4}"
        );
        // A pod address of the ENI's /80 routes out by the table (the plugin's rule 1536).
        ns.ip("-6 rule add from 2001:db8:1:1::7 lookup 2 pref 1536");
        let get = ns.ip("-6 route get 2001:db8:1:1::5 from 2001:db8:1:1::7");
        assert!(get.contains("via fe80:ec2::1 dev eth1"), "{get}");

        // Second run: nothing to do (the kernel reports IPv6 routes as planned).
        let before = ns.ip("-6 route show table all");
        assert!(host.setup_eni(&v6, 9001).await.unwrap().is_noop());
        assert_eq!(before, ns.ip("-6 route show table all"));

        // Dual-stack off: the IPv6 routes go, the IPv4 ones stay.
        assert!(!host.setup_eni(&eni(), 9001).await.unwrap().is_noop());
        assert!(ns.ip("-6 route show table 2").trim().is_empty());
        assert!(
            ns.ip("-4 route show table 2")
                .contains("default via 198.18.1.1")
        );
        host.setup_eni(&v6, 9001).await.unwrap();

        // Teardown removes both families of the table, and the IPv6 pod rule on it.
        let applied = host.teardown_eni(&v6).await.unwrap();
        assert!(!applied.is_noop());
        let rules6 = ns.ip("-6 rule show");
        assert!(!rules6.contains("lookup 2"), "{rules6}");
        assert!(ns.ip("-6 route show table 2").trim().is_empty());
        assert!(ns.ip("-4 route show table 2").trim().is_empty());
        assert!(host.teardown_eni(&v6).await.unwrap().is_noop());
    }

    /// The plugins' wait for duplicate address detection (`Netlink::wait_ipv6_settled`, as
    /// upstream's `WaitForAddressesToBeStable`) reports an address another host on the link
    /// already uses (`dadfailed`) once its deadline passes, and nothing for a unique one: the
    /// ADD then fails instead of handing the pod a dead address.
    #[tokio::test]
    async fn dad_wait_reports_a_duplicate_ipv6_address() {
        let ns = Ns::new("dad");
        let peer = Ns::new("dadpeer");
        ns.ip("link add va type veth peer name vb");
        ns.ip(&format!("link set vb netns {}", peer.name));
        ns.exec(&["sysctl", "-q", "-w", "net.ipv6.conf.va.accept_dad=1"]);
        ns.ip("link set va up");
        peer.ip("link set vb up");
        peer.ip("-6 addr add 2001:db8:dad::7/64 dev vb nodad");
        let nl = NetNs::named(&ns.name)
            .expect("open test netns")
            .connect()
            .await
            .expect("netlink");
        let va = nl.link_by_name("va").await.unwrap().expect("va");
        // Wait for va's own link-local address first, so only the addresses below count.
        let step = Duration::from_millis(50);
        nl.wait_ipv6_settled(va.index, Duration::from_secs(10), step)
            .await
            .unwrap();
        let unique: ipnet::IpNet = "2001:db8:dad::8/64".parse().unwrap();
        let taken: ipnet::IpNet = "2001:db8:dad::7/64".parse().unwrap();
        for prefix in [unique, taken] {
            let addr = dataplane::Address {
                ifindex: va.index,
                prefix,
            };
            nl.add_address(&addr, false).await.unwrap();
        }
        let unsettled = nl
            .wait_ipv6_settled(va.index, Duration::from_secs(5), step)
            .await
            .unwrap();
        assert_eq!(unsettled, vec![taken], "{}", ns.ip("-6 addr show dev va"));
        assert!(ns.ip("-6 addr show dev va").contains("dadfailed"));
    }

    #[tokio::test]
    async fn eni_on_second_card_uses_its_table_and_missing_link_is_retryable() {
        let ns = Ns::new("card");
        let host = ns.host(BackendChoice::Auto).await;
        let spec = EniSpec {
            device_number: 2,
            network_card: 1,
            ..eni()
        };
        assert!(matches!(
            host.setup_eni(&spec, 9001).await,
            Err(HostError::Eni(EniPlanError::NoLink(_)))
        ));
        add_eni_link(&ns, "eth2", ENI_MAC);
        host.setup_eni(&spec, 1500).await.unwrap();
        assert!(
            ns.ip("-4 route show table 10102")
                .contains("default via 198.18.1.1 dev eth2")
        );
        assert!(rules(&ns).contains("from 198.18.1.10 lookup 10102"));
        // The ENI moved to another table (e.g. upstream's old multi-card formula): converges.
        let moved = EniSpec {
            device_number: 3,
            ..spec.clone()
        };
        host.setup_eni(&moved, 1500).await.unwrap();
        let r = rules(&ns);
        assert!(
            r.contains("lookup 10103") && !r.contains("lookup 10102"),
            "{r}"
        );
        assert!(host.setup_eni(&moved, 1500).await.unwrap().is_noop());
    }

    /// The pool loop's host port over the test namespace, waiting on its link announcements.
    async fn host_enis(ns: &Ns, wait: Duration) -> ipamd::node_init::HostEnis {
        use ipamd::node_init::HostEnis;
        let links = NetNs::named(&ns.name)
            .expect("open test netns")
            .link_events()
            .await
            .expect("link announcements in the test netns");
        HostEnis::new(Arc::new(ns.host(BackendChoice::Auto).await), 9001, false)
            .with_link_events(links)
            .with_link_wait(wait)
    }

    fn attached() -> ipamd::pool::ec2_port::AttachedEni {
        let e = eni();
        ipamd::pool::ec2_port::AttachedEni {
            id: "eni-linkwait".into(),
            device_number: e.device_number,
            mac: e.mac.to_string(),
            subnet: e.subnet,
            primary_ip: e.primary_ip,
            ..ipamd::pool::ec2_port::AttachedEni::unflagged()
        }
    }

    // Issue 30: the ENI's set-up acts on the kernel's link announcement, whether the link
    // shows before or after EC2 answered the attach; a link that never shows is a clear
    // NoLink error (the ENI is registered not host-ready, as before); a link that comes and
    // goes is set up once it stays.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn eni_setup_waits_on_link_announcements() {
        use ipamd::pool::host_port::{EniHost, EniHostError};
        // link already there (shown before the attach answer)
        let ns = Ns::new("lw0");
        add_eni_link(&ns, "eth1", ENI_MAC);
        let host = host_enis(&ns, Duration::from_secs(20)).await;
        host.setup(&attached()).await.expect("set up at once");
        assert!(rules(&ns).contains("from 198.18.1.10 lookup 2"));
        drop(ns);

        // link shows 1.5 s after the set-up began: done well before the 2 s recheck would
        // have looked again, i.e. on the announcement
        let ns = Ns::new("lw1");
        let host = host_enis(&ns, Duration::from_secs(20)).await;
        let gen0 = host.link_generation();
        let name = ns.name.clone();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1500));
            sh(&[
                "ip",
                "-n",
                &name,
                "link",
                "add",
                "eth1",
                "address",
                &ENI_MAC.to_string(),
                "type",
                "veth",
                "peer",
                "name",
                "peth1",
            ]);
            std::time::Instant::now()
        });
        host.setup(&attached())
            .await
            .expect("set up once the link shows");
        let done = std::time::Instant::now();
        let shown = late.join().unwrap();
        assert!(
            done.duration_since(shown) < Duration::from_millis(400),
            "set-up finished {:?} after the link showed",
            done.duration_since(shown)
        );
        assert!(host.link_generation() > gen0, "announcements counted");
        assert!(
            ns.ip("-4 route show table 2")
                .contains("default via 198.18.1.1 dev eth1")
        );
        drop(ns);

        // link never shows: NoLink after the wait, nothing configured
        let ns = Ns::new("lw2");
        let host = host_enis(&ns, Duration::from_secs(1)).await;
        let t = std::time::Instant::now();
        let err = host.setup(&attached()).await.unwrap_err();
        assert_eq!(err, EniHostError::NoLink("eni-linkwait".into()));
        assert!(t.elapsed() >= Duration::from_secs(1));
        assert!(!rules(&ns).contains("lookup 2"), "nothing set up");
        drop(ns);

        // flapping: another link comes and goes, then the ENI's link appears, vanishes and
        // comes back: set up on the link that stays
        let ns = Ns::new("lw3");
        let host = host_enis(&ns, Duration::from_secs(20)).await;
        let name = ns.name.clone();
        let flap = std::thread::spawn(move || {
            let ip = |args: &str| {
                let mut argv = vec!["ip", "-n", name.as_str()];
                argv.extend(args.split_whitespace());
                sh(&argv);
            };
            std::thread::sleep(Duration::from_millis(300));
            ip("link add other type veth peer name pother");
            ip("link del other");
            std::thread::sleep(Duration::from_millis(300));
            ip(&format!(
                "link add eth1 address {ENI_MAC} type veth peer name peth1"
            ));
            ip("link del eth1");
            std::thread::sleep(Duration::from_millis(300));
            ip(&format!(
                "link add eth9 address {ENI_MAC} type veth peer name peth9"
            ));
        });
        let setup = host.setup(&attached()).await;
        flap.join().unwrap();
        // the set-up may have caught the short-lived eth1 (then the kernel removed its
        // routes with it); once the link stays, one more set-up converges on eth9
        if setup.is_err() || !ns.ip("-4 route show table 2").contains("dev eth9") {
            host.setup(&attached())
                .await
                .expect("set up on the link that stayed");
        }
        assert!(
            ns.ip("-4 route show table 2")
                .contains("default via 198.18.1.1 dev eth9")
        );
    }

    fn expected_snat_lines() -> Vec<&'static str> {
        vec![
            r#"-A POSTROUTING -m comment --comment "AWS SNAT CHAIN" -j AWS-SNAT-CHAIN-0"#,
            r#"-A AWS-SNAT-CHAIN-0 -d 198.19.0.0/16 -m comment --comment "AWS SNAT CHAIN EXCLUSION" -j RETURN"#,
            r#"-A AWS-SNAT-CHAIN-0 -d 198.18.0.0/16 -m comment --comment "AWS SNAT CHAIN" -j RETURN"#,
            r#"-A AWS-SNAT-CHAIN-0 ! -o vlan+ -m comment --comment "AWS, SNAT" -m addrtype ! --dst-type LOCAL -j SNAT --to-source 198.18.0.10 --random-fully"#,
            r#"-A PREROUTING -i eni+ -m comment --comment "AWS, outbound connections" -j AWS-CONNMARK-CHAIN-0"#,
            r#"-A PREROUTING -m comment --comment "AWS, CONNMARK" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80"#,
            r#"-A AWS-CONNMARK-CHAIN-0 -d 198.19.0.0/16 -m comment --comment "AWS CONNMARK CHAIN" -j RETURN"#,
            r#"-A AWS-CONNMARK-CHAIN-0 -d 198.18.0.0/16 -m comment --comment "AWS CONNMARK CHAIN" -j RETURN"#,
            r#"-A AWS-CONNMARK-CHAIN-0 -m comment --comment "AWS, CONNMARK" -j CONNMARK --set-xmark 0x80/0x80"#,
            r#"-A PREROUTING -i eth0 -m comment --comment "AWS, primary ENI" -m addrtype --dst-type LOCAL --limit-iface-in -j CONNMARK --set-xmark 0x80/0x80"#,
            r#"-A PREROUTING -i eni+ -m comment --comment "AWS, primary ENI" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80"#,
            r#"-A PREROUTING -i vlan+ -m comment --comment "AWS, primary ENI" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80"#,
        ]
    }

    /// [`expected_snat_lines`] as `backend` holds them: on nf_tables the nat connmark lives in
    /// the native table `ip aws-cni` instead (upstream v1.23 `nftConnmark`,
    /// tests/nft_connmark.rs), so its five iptables lines are absent.
    fn expected_iptables_lines(backend: Backend) -> Vec<String> {
        expected_snat_lines()
            .into_iter()
            .filter(|l| {
                backend == Backend::Legacy
                    || !(l.contains("AWS-CONNMARK-CHAIN-0")
                        || l.contains(r#"--comment "AWS, CONNMARK" -j CONNMARK --restore-mark"#))
            })
            .map(str::to_owned)
            .collect()
    }

    /// Our lines of an iptables-save dump (rules mentioning AWS), in order.
    fn aws_lines(save: &str) -> Vec<String> {
        save.lines()
            .filter(|l| l.starts_with("-A ") && l.contains("AWS"))
            .map(str::to_owned)
            .collect()
    }

    async fn node_setup_installs_upstream_layout(backend: Backend) {
        let ns = Ns::new("node");
        add_eni_link(&ns, "eth0", PRIMARY_MAC);
        // Strict reverse-path filtering (the init container has not run): ipamd reports it
        // and leaves it alone (it writes no kernel setting, issue 37).
        ns.exec(&[
            "sysctl",
            "-q",
            "-w",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.eth0.rp_filter=1",
        ]);
        let host = ns.host(BackendChoice::Fixed(backend)).await;

        let applied = host.setup_node(&node_spec()).await.unwrap();
        assert!(!applied.iptables.is_empty() && !applied.routing.is_empty());
        assert_eq!(applied.rp_filter, Some(RpFilter::Strict));
        let save = ns.iptables_save(backend);
        let mut got = aws_lines(&save);
        let mut want = expected_iptables_lines(backend);
        got.sort();
        want.sort();
        assert_eq!(got, want, "{save}");
        let r = rules(&ns);
        assert!(
            r.contains("1024:\tfrom all fwmark 0x80/0x80 lookup main"),
            "{r}"
        );
        assert!(
            r.contains("1535:\tfrom all to 203.0.113.128/25 lookup main"),
            "{r}"
        );
        assert!(ns.ip("link show dev eth0").contains("mtu 9001"));
        assert_eq!(
            ns.exec(&["sysctl", "-n", "net.ipv4.conf.eth0.rp_filter"])
                .trim(),
            "1",
            "ipamd must not write rp_filter"
        );
        // The init container's loose mode (aws-vpc-cni-init.sh) is seen as such.
        ns.exec(&["sysctl", "-q", "-w", "net.ipv4.conf.eth0.rp_filter=2"]);

        // Restart: nothing changes.
        let again = host.setup_node(&node_spec()).await.unwrap();
        assert!(again.is_noop(), "{again:?}");
        assert_eq!(again.rp_filter, Some(RpFilter::Loose));
        assert_eq!(save, strip_dates(&ns.iptables_save(backend), &save));

        // External SNAT: SNAT and nat connmark chains go; NodePort rules stay.
        let external = NodeSpec {
            external_snat: true,
            ..node_spec()
        };
        host.setup_node(&external).await.unwrap();
        let save = ns.iptables_save(backend);
        assert!(
            !save.contains("AWS-SNAT-CHAIN") && !save.contains("AWS-CONNMARK-CHAIN"),
            "{save}"
        );
        assert_eq!(aws_lines(&save).len(), 3, "{save}");
        assert!(host.setup_node(&external).await.unwrap().is_noop());
        // Back again.
        host.setup_node(&node_spec()).await.unwrap();
        assert_eq!(
            aws_lines(&ns.iptables_save(backend)).len(),
            expected_iptables_lines(backend).len()
        );

        // Issue 39: a match-all exclusion (`AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS=0.0.0.0/0`),
        // which iptables-save prints without `-d`, converges once and then changes nothing.
        let all = NodeSpec {
            exclude_snat_cidrs: vec!["0.0.0.0/0".parse().unwrap()],
            ..node_spec()
        };
        host.setup_node(&all).await.unwrap();
        let again = host.setup_node(&all).await.unwrap();
        assert!(again.is_noop(), "{again:?}\n{}", ns.iptables_save(backend));
    }

    /// `b` with its `#` comment lines (timestamps) replaced by those of `a`.
    fn strip_dates(b: &str, a: &str) -> String {
        let mut comments = a.lines().filter(|l| l.starts_with('#'));
        b.lines()
            .map(|l| {
                if l.starts_with('#') {
                    comments.next().unwrap_or(l).to_owned()
                } else {
                    l.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
            + if b.ends_with('\n') { "\n" } else { "" }
    }

    /// IPv6 mode (upstream `SetupHostNetwork` with `v6Enabled`): no SNAT or connmark chains,
    /// the fwmark rule in the IPv6 family, the IPv4 FORWARD reject of egress-cni's range at
    /// position 1 (once, also after a restart); IPv4 mode with `ENABLE_V6_EGRESS`: the
    /// ip6tables reject of `fd00::ac:00/118`.
    async fn ipv6_mode_node_setup(backend: Backend) {
        let ns = Ns::new("v6node");
        add_eni_link(&ns, "eth0", PRIMARY_MAC);
        let host = ns.host(BackendChoice::Fixed(backend)).await;
        let v6 = NodeSpec {
            ipv6: true,
            ..node_spec()
        };
        host.setup_node(&v6).await.unwrap();
        let save = ns.iptables_save(backend);
        assert!(
            !save.contains("AWS-SNAT-CHAIN") && !save.contains("AWS-CONNMARK-CHAIN"),
            "{save}"
        );
        let program = match backend {
            Backend::Legacy => "iptables-legacy",
            Backend::Nft => "iptables-nft",
        };
        let fwd = ns.exec(&[program, "-t", "filter", "-S", "FORWARD"]);
        let first = fwd.lines().nth(1).unwrap_or_default();
        assert!(
            first.contains("-d 169.254.172.0/22")
                && first.contains("--ctstate NEW")
                && first.contains("Block Node Local Pod access via IPv4")
                && first.contains("-j REJECT"),
            "{fwd}"
        );
        let r6 = ns.exec(&["ip", "-6", "rule", "show"]);
        assert!(
            r6.contains("1024:\tfrom all fwmark 0x80/0x80 lookup main"),
            "{r6}"
        );
        assert!(
            !rules(&ns).contains("1024:"),
            "no IPv4 fwmark rule in IPv6 mode"
        );
        host.setup_node(&v6).await.unwrap();
        let fwd = ns.exec(&[program, "-t", "filter", "-S", "FORWARD"]);
        assert_eq!(fwd.matches("Block Node Local").count(), 1, "{fwd}");

        let egress = NodeSpec {
            block_v6_egress_range: true,
            ..node_spec()
        };
        host.setup_node(&egress).await.unwrap();
        host.setup_node(&egress).await.unwrap();
        let program6 = match backend {
            Backend::Legacy => "ip6tables-legacy",
            Backend::Nft => "ip6tables-nft",
        };
        let fwd6 = ns.exec(&[program6, "-t", "filter", "-S", "FORWARD"]);
        assert_eq!(
            fwd6.matches("Block Node Local Pod access via IPv6").count(),
            1,
            "{fwd6}"
        );
        assert!(fwd6.contains("-d fd00::ac:0/118"), "{fwd6}");
    }

    #[tokio::test]
    async fn ipv6_mode_node_setup_nft() {
        ipv6_mode_node_setup(Backend::Nft).await;
    }

    #[tokio::test]
    async fn ipv6_mode_node_setup_legacy() {
        ipv6_mode_node_setup(Backend::Legacy).await;
    }

    #[tokio::test]
    async fn node_setup_nft_backend() {
        node_setup_installs_upstream_layout(Backend::Nft).await;
    }

    #[tokio::test]
    async fn node_setup_legacy_backend() {
        node_setup_installs_upstream_layout(Backend::Legacy).await;
    }

    fn snat_config(primary_interface: &str) -> SnatConfig {
        node_spec().snat_config(primary_interface)
    }

    #[tokio::test]
    async fn older_layouts_converge_and_foreign_rules_survive() {
        let ns = Ns::new("stale");
        // Upstream's chain-per-CIDR layout, its legacy connmark rule, a changed SNAT source, and
        // someone else's rules around ours.
        for cmd in [
            "-t nat -N KUBE-POSTROUTING",
            "-t nat -A POSTROUTING -m comment --comment kube -j KUBE-POSTROUTING",
            "-t nat -N AWS-SNAT-CHAIN-0",
            "-t nat -N AWS-SNAT-CHAIN-1",
            "-t nat -N AWS-SNAT-CHAIN-2",
            "-t nat -A POSTROUTING -m comment --comment AWS\\ SNAT\\ CHAIN -j AWS-SNAT-CHAIN-0",
            "-t nat -A AWS-SNAT-CHAIN-0 ! -d 198.18.0.0/16 -m comment --comment AWS\\ SNAT\\ CHAIN -j AWS-SNAT-CHAIN-1",
            "-t nat -A AWS-SNAT-CHAIN-1 ! -d 10.99.0.0/16 -m comment --comment AWS\\ SNAT\\ CHAIN -j AWS-SNAT-CHAIN-2",
            "-t nat -A AWS-SNAT-CHAIN-2 ! -o vlan+ -m comment --comment AWS,\\ SNAT -m addrtype ! --dst-type LOCAL -j SNAT --to-source 198.18.0.99",
            "-t nat -N AWS-CONNMARK-CHAIN-0",
            "-t nat -N AWS-CONNMARK-CHAIN-1",
            "-t nat -A PREROUTING -i eni+ -m comment --comment AWS,\\ outbound\\ connections -m state --state NEW -j AWS-CONNMARK-CHAIN-0",
            "-t nat -A PREROUTING -m comment --comment kube-pre -j RETURN",
        ] {
            // Split like a shell would for the escaped spaces above.
            let args: Vec<String> = split_escaped(cmd);
            let mut argv = vec!["iptables-nft"];
            argv.extend(args.iter().map(String::as_str));
            ns.exec(&argv);
        }
        let host = ns.host(BackendChoice::Fixed(Backend::Nft)).await;
        host.update_snat(&snat_config("eth0")).await.unwrap();
        let save = ns.iptables_save(Backend::Nft);
        for gone in [
            "AWS-SNAT-CHAIN-1",
            "AWS-SNAT-CHAIN-2",
            "AWS-CONNMARK-CHAIN-1",
            "--state NEW",
            "198.18.0.99",
        ] {
            assert!(!save.contains(gone), "{gone} left:\n{save}");
        }
        assert!(save.contains("-A POSTROUTING -m comment --comment kube -j KUBE-POSTROUTING"));
        assert!(save.contains("--comment kube-pre -j RETURN"));
        let mut got = aws_lines(&save);
        let mut want = expected_iptables_lines(Backend::Nft);
        got.sort();
        want.sort();
        assert_eq!(got, want, "{save}");
        assert!(
            host.update_snat(&snat_config("eth0"))
                .await
                .unwrap()
                .is_noop()
        );
    }

    fn split_escaped(cmd: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut cur = String::new();
        let mut chars = cmd.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' => cur.extend(chars.next()),
                ' ' => {
                    if !cur.is_empty() {
                        out.push(std::mem::take(&mut cur));
                    }
                }
                c => cur.push(c),
            }
        }
        if !cur.is_empty() {
            out.push(cur);
        }
        out
    }

    #[tokio::test]
    async fn auto_backend_follows_existing_rules_and_cleans_the_other_backend() {
        let ns = Ns::new("auto");
        // The host uses legacy (kubelet's rules live there); an older install left our chain in
        // nf_tables.
        for i in 0..3 {
            let dst = format!("10.250.{i}.0/24");
            ns.exec(&[
                "iptables-legacy",
                "-t",
                "filter",
                "-A",
                "FORWARD",
                "-d",
                &dst,
                "-j",
                "ACCEPT",
            ]);
        }
        ns.exec(&["iptables-nft", "-t", "nat", "-N", "AWS-SNAT-CHAIN-0"]);
        ns.exec(&[
            "iptables-nft",
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-m",
            "comment",
            "--comment",
            "AWS SNAT CHAIN",
            "-j",
            "AWS-SNAT-CHAIN-0",
        ]);
        let host = ns.host(BackendChoice::Auto).await;
        host.update_snat(&snat_config("eth0")).await.unwrap();
        assert_eq!(aws_lines(&ns.iptables_save(Backend::Legacy)).len(), 12);
        let nft = ns.iptables_save(Backend::Nft);
        assert!(!nft.contains("AWS"), "{nft}");
        assert!(
            host.update_snat(&snat_config("eth0"))
                .await
                .unwrap()
                .is_noop()
        );
    }

    #[tokio::test]
    async fn pod_rules_of_unassigned_ips_are_pruned() {
        let ns = Ns::new("prune");
        for (ip, table) in [("198.18.1.5", 2), ("198.18.1.6", 2), ("198.18.2.7", 3)] {
            ns.ip(&format!("rule add to {ip} lookup main pref 512"));
            ns.ip(&format!("rule add from {ip} lookup {table} pref 1536"));
        }
        ns.ip("rule add from 198.18.1.10 lookup 2 pref 32765");
        let host = ns.host(BackendChoice::Auto).await;
        let assigned: Vec<IpAddr> = vec!["198.18.1.5".parse().unwrap()];
        let applied = host.prune_pod_rules(&assigned).await.unwrap();
        assert_eq!(applied.routing.len(), 4);
        let r = rules(&ns);
        assert!(r.contains("to 198.18.1.5 lookup main") && r.contains("from 198.18.1.5 lookup 2"));
        assert!(
            !r.contains("198.18.1.6") && !r.contains("198.18.2.7"),
            "{r}"
        );
        assert!(r.contains("from 198.18.1.10 lookup 2"), "{r}");
        assert!(host.prune_pod_rules(&assigned).await.unwrap().is_noop());
    }

    /// Accepts one TCP connection on `addr` inside `ns` and returns the peer's address.
    fn accept_once(ns: &str, addr: SocketAddr) -> std::thread::JoinHandle<SocketAddr> {
        let ns = NetNs::named(ns).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            ns.run(move || {
                let listener = TcpListener::bind(addr).expect("bind in peer netns");
                tx.send(()).unwrap();
                let (_conn, peer) = listener.accept().expect("accept");
                peer
            })
            .expect("enter peer netns")
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("listener up");
        handle
    }

    fn connect_from(ns: &str, addr: SocketAddr) {
        NetNs::named(ns)
            .unwrap()
            .run(move || {
                TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
            })
            .unwrap();
    }

    #[tokio::test]
    async fn pod_traffic_to_non_vpc_is_snated_and_vpc_traffic_is_not() {
        // pod (198.18.0.50) --eniXXXX-- node (eth0 198.18.0.10/24) --- peer (198.18.0.1, 203.0.113.1)
        let node = Ns::new("tnode");
        let pod = Ns::new("tpod");
        let peer = Ns::new("tpeer");
        node.ip(&format!(
            "link add eth0 address {PRIMARY_MAC} type veth peer name up0 netns {}",
            peer.name
        ));
        node.ip(&format!(
            "link add enitest0 type veth peer name eth0 netns {}",
            pod.name
        ));
        node.ip("addr add 198.18.0.10/24 dev eth0");
        node.ip("link set eth0 up");
        node.ip("link set enitest0 up");
        node.ip("route add 198.18.0.50/32 dev enitest0 scope link");
        node.ip("route add default via 198.18.0.1 dev eth0");
        node.exec(&["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]);
        node.exec(&["sysctl", "-q", "-w", "net.ipv4.conf.enitest0.proxy_arp=1"]);
        pod.ip("addr add 198.18.0.50/32 dev eth0");
        pod.ip("link set eth0 up");
        pod.ip("route add 169.254.1.1 dev eth0 scope link");
        pod.ip("route add default via 169.254.1.1 dev eth0");
        peer.ip("addr add 198.18.0.1/24 dev up0");
        peer.ip("addr add 203.0.113.1/32 dev up0");
        peer.ip("link set up0 up");
        peer.ip("route add 198.18.0.50/32 via 198.18.0.10");

        let host = node.host(BackendChoice::Auto).await;
        host.setup_node(&node_spec()).await.unwrap();

        let internet: SocketAddr = "203.0.113.1:18080".parse().unwrap();
        let waiter = accept_once(&peer.name, internet);
        connect_from(&pod.name, internet);
        let seen = waiter.join().unwrap();
        assert_eq!(
            seen.ip(),
            IpAddr::V4(Ipv4Addr::new(198, 18, 0, 10)),
            "SNATed to primary IP"
        );

        let vpc: SocketAddr = "198.18.0.1:18081".parse().unwrap();
        let waiter = accept_once(&peer.name, vpc);
        connect_from(&pod.name, vpc);
        let seen = waiter.join().unwrap();
        assert_eq!(
            seen.ip(),
            IpAddr::V4(Ipv4Addr::new(198, 18, 0, 50)),
            "VPC traffic keeps pod IP"
        );

        // External SNAT: the pod's address leaves unchanged.
        host.setup_node(&NodeSpec {
            external_snat: true,
            ..node_spec()
        })
        .await
        .unwrap();
        let internet2: SocketAddr = "203.0.113.1:18082".parse().unwrap();
        let waiter = accept_once(&peer.name, internet2);
        connect_from(&pod.name, internet2);
        assert_eq!(
            waiter.join().unwrap().ip(),
            IpAddr::V4(Ipv4Addr::new(198, 18, 0, 50))
        );
    }
}
