//! Issue 26 item 4: the pod connmark as upstream v1.23 programs it (`#3588`,
//! `pkg/networkutils/nftables_connmark.go` and `iptables_connmark.go`): the native table
//! `ip aws-cni` on a node whose iptables is nf_tables, iptables `AWS-CONNMARK-CHAIN-0` on a
//! legacy one, and exactly one of them after any takeover or switch. Kernel tests: every `nft`,
//! `iptables*` and `ip` command and netlink socket is aimed at a namespace created here
//! (`nftc-<pid>-...`, deleted on drop, also on panic); nothing runs in the root namespace.
//! Root only; needs `nft` (Debian package `nftables`, installed by integration/test.sh).

#[cfg(test)]
mod kernel {
    use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
    use std::process::Command;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use dataplane::{MacAddr, NetNs};
    use integration::supervisor;
    use ipamd::host::{
        Backend, BackendChoice, ConnmarkBackend, Exec, HostNetwork, NftOp, NodeSpec, RandomizeSnat,
        SnatConfig,
    };

    const PREFIX: &str = "nftc-";
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    const PRIMARY_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0x02, 0x01]);

    /// A namespace deleted on drop (also on panic); stale ones of crashed runs (their pid is
    /// gone) are removed at creation.
    struct Ns {
        name: String,
    }

    impl Ns {
        fn new(tag: &str) -> Option<Self> {
            if !integration::can_run_kernel_tests() {
                return None;
            }
            assert!(
                Command::new("nft").arg("--version").output().is_ok(),
                "nft is missing: apt-get install nftables (integration/test.sh does)"
            );
            supervisor::remove_stale_netns(PREFIX);
            let name = format!(
                "{PREFIX}{}-{tag}{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::SeqCst)
            );
            supervisor::add_netns(&name).unwrap_or_else(|e| panic!("{e}"));
            Some(Self { name })
        }

        /// Runs `argv` inside the namespace; panics on failure.
        fn exec(&self, argv: &[&str]) -> String {
            self.exec_stdin(argv, None)
        }

        fn exec_stdin(&self, argv: &[&str], stdin: Option<&str>) -> String {
            use std::io::Write;
            let mut child = Command::new("ip")
                .args(["netns", "exec", &self.name])
                .args(argv)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {argv:?}: {e}"));
            if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
                pipe.write_all(input.as_bytes()).unwrap();
            }
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{argv:?} failed: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                stdin.unwrap_or_default()
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        }

        fn nft_f(&self, script: &str) {
            self.exec_stdin(&["nft", "-f", "-"], Some(script));
        }

        fn ip(&self, args: &str) {
            let mut argv = vec!["ip"];
            argv.extend(args.split_whitespace());
            self.exec(&argv);
        }

        /// `nft list table ip aws-cni` (counters zeroed, so listings compare), or `None`.
        fn aws_cni_table(&self) -> Option<String> {
            let tables = self.exec(&["nft", "list", "tables"]);
            tables
                .lines()
                .any(|l| l.trim() == "table ip aws-cni")
                .then(|| zero_counters(&self.exec(&["nft", "list", "table", "ip", "aws-cni"])))
        }

        /// Our rules in `backend`'s iptables (lines mentioning AWS).
        fn aws_iptables(&self, backend: Backend) -> Vec<String> {
            self.exec(&[backend.save_program()])
                .lines()
                .filter(|l| (l.starts_with("-A ") || l.starts_with(':')) && l.contains("AWS"))
                .map(|l| l.split(" [").next().unwrap_or(l).to_owned())
                .collect()
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

    fn zero_counters(listing: &str) -> String {
        let words: Vec<&str> = listing.split(' ').collect();
        let mut out = Vec::with_capacity(words.len());
        let mut i = 0;
        while i < words.len() {
            out.push(words[i]);
            if matches!(words[i], "packets" | "bytes") && i + 1 < words.len() {
                out.push("0");
                i += 1;
            }
            i += 1;
        }
        out.join(" ")
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
            external_service_cidrs: vec![],
            ipv6: false,
            block_v6_egress_range: false,
        }
    }

    fn snat() -> SnatConfig {
        node_spec().snat_config("eth0")
    }

    /// What `nft list table ip aws-cni` shows for [`node_spec`] (nft 1.0.6): upstream Setup's
    /// doc comment (nftables_connmark.go), as nft prints it: priority -90 is `dstnat + 10`.
    const EXPECTED_TABLE: &str = "table ip aws-cni {
\tchain nat-prerouting {
\t\ttype nat hook prerouting priority dstnat + 10; policy accept;
\t\tfib daddr type local return
\t\tiifname \"eni*\" counter packets 0 bytes 0 jump snat-mark
\t\tcounter packets 0 bytes 0 meta mark set ct mark & 0x00000080
\t}

\tchain snat-mark {
\t\tcounter packets 0 bytes 0 ip daddr 198.19.0.0/16 return
\t\tcounter packets 0 bytes 0 ip daddr 198.18.0.0/16 return
\t\tcounter packets 0 bytes 0 ct mark set ct mark | 0x00000080
\t}
}
";

    /// upstream v1.23's table as its netlink code (google/nftables) leaves it: same bytecode
    /// as ours (4-byte daddr load, mask, compare: `insertCIDRReturnRule`), the returns in its
    /// Go-map order, with traffic counted.
    const UPSTREAM_TABLE: &str = "table ip aws-cni {
  chain nat-prerouting {
    type nat hook prerouting priority -90; policy accept;
    fib daddr type local return
    iifname \"eni*\" counter packets 7 bytes 420 jump snat-mark
    counter packets 9 bytes 540 meta mark set ct mark & 0x80
  }
  chain snat-mark {
    counter packets 1 bytes 60 ip daddr & 255.255.0.0 == 198.18.0.0 return
    counter ip daddr & 255.255.0.0 == 198.19.0.0 return
    counter packets 6 bytes 360 ct mark set ct mark | 0x80
  }
}
";

    /// upstream's iptables connmark (iptables_connmark.go `buildRules`), also what our
    /// versions before this one left on every node, as `iptables-restore --noflush` input.
    const IPTABLES_CONNMARK: &str = r#"*nat
:AWS-CONNMARK-CHAIN-0 - [0:0]
-A PREROUTING -i eni+ -m comment --comment "AWS, outbound connections" -j AWS-CONNMARK-CHAIN-0
-A PREROUTING -m comment --comment "AWS, CONNMARK" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80
-A AWS-CONNMARK-CHAIN-0 -d 198.19.0.0/16 -m comment --comment "AWS CONNMARK CHAIN" -j RETURN
-A AWS-CONNMARK-CHAIN-0 -d 198.18.0.0/16 -m comment --comment "AWS CONNMARK CHAIN" -j RETURN
-A AWS-CONNMARK-CHAIN-0 -m comment --comment "AWS, CONNMARK" -j CONNMARK --set-xmark 0x80/0x80
COMMIT
"#;

    /// The iptables lines that stay on both backends: SNAT chain and mangle rules
    /// (network.go `buildIptablesSNATRules`, `buildIptablesConnmarkRules`).
    fn expected_iptables_without_connmark() -> Vec<String> {
        let mut v: Vec<String> = [
            ":AWS-SNAT-CHAIN-0 -",
            r#"-A POSTROUTING -m comment --comment "AWS SNAT CHAIN" -j AWS-SNAT-CHAIN-0"#,
            r#"-A AWS-SNAT-CHAIN-0 -d 198.19.0.0/16 -m comment --comment "AWS SNAT CHAIN EXCLUSION" -j RETURN"#,
            r#"-A AWS-SNAT-CHAIN-0 -d 198.18.0.0/16 -m comment --comment "AWS SNAT CHAIN" -j RETURN"#,
            r#"-A AWS-SNAT-CHAIN-0 ! -o vlan+ -m comment --comment "AWS, SNAT" -m addrtype ! --dst-type LOCAL -j SNAT --to-source 198.18.0.10 --random-fully"#,
            r#"-A PREROUTING -i eth0 -m comment --comment "AWS, primary ENI" -m addrtype --dst-type LOCAL --limit-iface-in -j CONNMARK --set-xmark 0x80/0x80"#,
            r#"-A PREROUTING -i eni+ -m comment --comment "AWS, primary ENI" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80"#,
            r#"-A PREROUTING -i vlan+ -m comment --comment "AWS, primary ENI" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80"#,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        v.sort();
        v
    }

    fn expected_iptables_with_connmark() -> Vec<String> {
        let mut v = expected_iptables_without_connmark();
        v.extend(
            [
                ":AWS-CONNMARK-CHAIN-0 -",
                r#"-A PREROUTING -i eni+ -m comment --comment "AWS, outbound connections" -j AWS-CONNMARK-CHAIN-0"#,
                r#"-A PREROUTING -m comment --comment "AWS, CONNMARK" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80"#,
                r#"-A AWS-CONNMARK-CHAIN-0 -d 198.19.0.0/16 -m comment --comment "AWS CONNMARK CHAIN" -j RETURN"#,
                r#"-A AWS-CONNMARK-CHAIN-0 -d 198.18.0.0/16 -m comment --comment "AWS CONNMARK CHAIN" -j RETURN"#,
                r#"-A AWS-CONNMARK-CHAIN-0 -m comment --comment "AWS, CONNMARK" -j CONNMARK --set-xmark 0x80/0x80"#,
            ]
            .iter()
            .map(|s| (*s).to_owned()),
        );
        v.sort();
        v
    }

    /// The listing with the run of `ip daddr ... return` lines sorted: their order does not
    /// matter (upstream inserts them from a Go map, ensureConnmarkChainRules).
    fn returns_sorted(listing: &str) -> String {
        let mut out: Vec<&str> = Vec::new();
        let mut run: Vec<&str> = Vec::new();
        for line in listing.lines() {
            if line.contains(" ip daddr ") {
                run.push(line);
                continue;
            }
            run.sort_unstable();
            out.append(&mut run);
            out.push(line);
        }
        out.append(&mut run);
        out.join("\n")
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    /// Exactly one connmark implementation, the one `want` names, and the rest of the layout.
    fn assert_one_connmark(ns: &Ns, backend: Backend, want: ConnmarkBackend) {
        let table = ns.aws_cni_table();
        let ipt = sorted(ns.aws_iptables(backend));
        let other = ns.aws_iptables(backend.other());
        assert!(
            other.is_empty(),
            "our rules in the other backend: {other:#?}"
        );
        match want {
            ConnmarkBackend::Nftables => {
                assert_eq!(
                    table.as_deref().map(returns_sorted),
                    Some(returns_sorted(EXPECTED_TABLE))
                );
                assert_eq!(ipt, expected_iptables_without_connmark());
            }
            ConnmarkBackend::Iptables => {
                assert_eq!(
                    table, None,
                    "table ip aws-cni left beside iptables connmark"
                );
                assert_eq!(ipt, expected_iptables_with_connmark());
            }
        }
    }

    #[tokio::test]
    async fn nf_tables_node_gets_upstreams_table_and_no_iptables_connmark() {
        let Some(ns) = Ns::new("fresh") else { return };
        let host = ns.host(BackendChoice::Fixed(Backend::Nft)).await;
        let applied = host.update_snat(&snat()).await.unwrap();
        assert_eq!(applied.connmark_backend, Some(ConnmarkBackend::Nftables));
        assert!(matches!(applied.nftables[..], [NftOp::Replace(_)]));
        assert_one_connmark(&ns, Backend::Nft, ConnmarkBackend::Nftables);
        // Upstream's bytecode, not only its listing: the CIDR match is a 4-byte load, a
        // mask and a compare (insertCIDRReturnRule; the plain `ip daddr 198.18.0.0/16`
        // syntax would load 2 bytes), the iifname compare is the 3-byte prefix (addJumpRule).
        let vm = ns.exec(&[
            "nft",
            "--debug=netlink",
            "list",
            "chain",
            "ip",
            "aws-cni",
            "snat-mark",
        ]);
        assert_eq!(
            vm.matches("payload load 4b @ network header + 16 => reg 1")
                .count(),
            2,
            "{vm}"
        );
        assert!(
            vm.contains("bitwise reg 1 = ( reg 1 & 0x0000ffff ) ^ 0x00000000"),
            "{vm}"
        );
        assert!(
            vm.contains("bitwise reg 1 = ( reg 1 & 0xffffff7f ) ^ 0x00000080"),
            "{vm}"
        );
        let vm = ns.exec(&[
            "nft",
            "--debug=netlink",
            "list",
            "chain",
            "ip",
            "aws-cni",
            "nat-prerouting",
        ]);
        assert!(vm.contains("cmp eq reg 1 0x00696e65"), "{vm}");
        assert!(vm.contains("[ cmp eq reg 1 0x00000002 ]"), "{vm}");
        // Restart: nothing changes (same handles: the table was not rebuilt).
        let handles = ns.exec(&["nft", "-a", "list", "table", "ip", "aws-cni"]);
        let again = host.update_snat(&snat()).await.unwrap();
        assert!(again.is_noop(), "{again:?}");
        assert_eq!(
            handles,
            ns.exec(&["nft", "-a", "list", "table", "ip", "aws-cni"])
        );
    }

    #[tokio::test]
    async fn legacy_node_keeps_iptables_connmark_and_no_table() {
        let Some(ns) = Ns::new("legacy") else { return };
        let host = ns.host(BackendChoice::Fixed(Backend::Legacy)).await;
        let applied = host.update_snat(&snat()).await.unwrap();
        assert_eq!(applied.connmark_backend, Some(ConnmarkBackend::Iptables));
        assert!(applied.nftables.is_empty());
        assert_one_connmark(&ns, Backend::Legacy, ConnmarkBackend::Iptables);
        assert!(host.update_snat(&snat()).await.unwrap().is_noop());
    }

    #[tokio::test]
    async fn takeover_of_upstreams_nf_tables_node_keeps_its_table_untouched() {
        // upstream v1.23 on an nf_tables node: its table (returns in another order, counters
        // running), SNAT and mangle in iptables-nft, no AWS-CONNMARK-CHAIN-0 (its Setup ran
        // cleanupIptablesConnmarkRules). Auto picks nf_tables from the existing rules.
        let Some(ns) = Ns::new("upnft") else { return };
        // Upstream's SNAT chain and mangle rules (the same on both implementations) laid out
        // by one run of ours, then upstream's own table put back in place of ours.
        let first = ns.host(BackendChoice::Fixed(Backend::Nft)).await;
        first.update_snat(&snat()).await.unwrap();
        ns.nft_f(&format!("delete table ip aws-cni\n{UPSTREAM_TABLE}"));
        let handles = ns.exec(&["nft", "-a", "list", "table", "ip", "aws-cni"]);

        let host = ns.host(BackendChoice::Auto).await;
        let applied = host.update_snat(&snat()).await.unwrap();
        assert!(applied.is_noop(), "{applied:?}");
        assert_eq!(applied.connmark_backend, Some(ConnmarkBackend::Nftables));
        assert_eq!(
            handles,
            ns.exec(&["nft", "-a", "list", "table", "ip", "aws-cni"])
        );
        assert_one_connmark(&ns, Backend::Nft, ConnmarkBackend::Nftables);
    }

    #[tokio::test]
    async fn takeover_with_both_layouts_side_by_side_ends_with_the_table_only() {
        // The table plus the iptables chain (upstream v1.23 upgraded from an iptables-era
        // version before its first Setup finished, or our earlier version started on a node
        // upstream v1.23 had laid out): the iptables connmark goes, the table stays.
        let Some(ns) = Ns::new("both") else { return };
        ns.nft_f(UPSTREAM_TABLE);
        ns.exec_stdin(
            &["iptables-nft-restore", "--noflush"],
            Some(IPTABLES_CONNMARK),
        );
        let host = ns.host(BackendChoice::Auto).await;
        let applied = host.update_snat(&snat()).await.unwrap();
        assert!(
            applied.nftables.is_empty(),
            "upstream's table is kept: {applied:?}"
        );
        assert_one_connmark(&ns, Backend::Nft, ConnmarkBackend::Nftables);
        assert!(host.update_snat(&snat()).await.unwrap().is_noop());
    }

    #[tokio::test]
    async fn our_earlier_iptables_connmark_on_an_nf_tables_node_moves_to_the_table() {
        // Our versions before this one programmed the connmark through iptables-nft on every
        // node: the whole earlier layout, no table.
        let Some(ns) = Ns::new("earlier") else { return };
        let earlier = ns.host(BackendChoice::Fixed(Backend::Nft)).await;
        earlier.update_snat(&snat()).await.unwrap();
        ns.nft_f("delete table ip aws-cni");
        ns.exec_stdin(
            &["iptables-nft-restore", "--noflush"],
            Some(IPTABLES_CONNMARK),
        );
        assert_eq!(
            sorted(ns.aws_iptables(Backend::Nft)),
            expected_iptables_with_connmark()
        );

        let host = ns.host(BackendChoice::Auto).await;
        let applied = host.update_snat(&snat()).await.unwrap();
        assert!(matches!(applied.nftables[..], [NftOp::Replace(_)]));
        assert_one_connmark(&ns, Backend::Nft, ConnmarkBackend::Nftables);
        assert!(host.update_snat(&snat()).await.unwrap().is_noop());
    }

    #[tokio::test]
    async fn legacy_node_with_a_left_over_table_drops_it() {
        // A node moved from nf_tables to legacy iptables (upstream iptablesConnmark.Setup →
        // cleanupNFTStaleRules deletes `ip aws-cni`), with kubelet's rules in legacy so Auto
        // picks legacy.
        let Some(ns) = Ns::new("back") else { return };
        ns.nft_f(UPSTREAM_TABLE);
        for chain in ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"] {
            ns.exec(&["iptables-legacy", "-t", "mangle", "-N", chain]);
        }
        let host = ns.host(BackendChoice::Auto).await;
        let applied = host.update_snat(&snat()).await.unwrap();
        assert_eq!(applied.connmark_backend, Some(ConnmarkBackend::Iptables));
        assert_eq!(applied.nftables, [NftOp::Delete]);
        assert_one_connmark(&ns, Backend::Legacy, ConnmarkBackend::Iptables);
        assert!(host.update_snat(&snat()).await.unwrap().is_noop());
    }

    #[tokio::test]
    async fn external_snat_and_vpc_cidr_changes_reach_the_table() {
        let Some(ns) = Ns::new("knobs") else { return };
        let host = ns.host(BackendChoice::Fixed(Backend::Nft)).await;
        host.update_snat(&snat()).await.unwrap();
        // A VPC CIDR associated at run time (upstream updateCIDRsRulesOnChange →
        // UpdateHostSNATRules → Setup with the new list).
        let grown = SnatConfig {
            vpc_cidrs: vec![
                "198.18.0.0/16".parse().unwrap(),
                "100.64.0.0/16".parse().unwrap(),
            ],
            ..snat()
        };
        let applied = host.update_snat(&grown).await.unwrap();
        assert!(matches!(applied.nftables[..], [NftOp::Replace(_)]));
        let table = ns.aws_cni_table().unwrap();
        assert!(table.contains("ip daddr 100.64.0.0/16 return"), "{table}");
        assert!(
            ns.aws_iptables(Backend::Nft)
                .iter()
                .any(|l| l.contains("-d 100.64.0.0/16") && l.contains("AWS SNAT CHAIN")),
        );
        assert!(host.update_snat(&grown).await.unwrap().is_noop());
        // AWS_VPC_K8S_CNI_CONNMARK and AWS_VPC_K8S_CNI_VETHPREFIX.
        let custom = SnatConfig {
            connmark: 0x4000,
            veth_prefix: "cali".into(),
            ..snat()
        };
        host.update_snat(&custom).await.unwrap();
        let table = ns.aws_cni_table().unwrap();
        assert!(table.contains("iifname \"cali*\""), "{table}");
        assert!(
            table.contains("meta mark set ct mark & 0x00004000"),
            "{table}"
        );
        assert!(
            table.contains("ct mark set ct mark | 0x00004000"),
            "{table}"
        );
        // AWS_VPC_K8S_CNI_EXTERNALSNAT: upstream Cleanup deletes the table; no iptables
        // connmark comes back.
        let external = SnatConfig {
            external_snat: true,
            ..snat()
        };
        let applied = host.update_snat(&external).await.unwrap();
        assert_eq!(applied.nftables, [NftOp::Delete]);
        assert_eq!(ns.aws_cni_table(), None);
        assert!(
            ns.aws_iptables(Backend::Nft)
                .iter()
                .all(|l| !l.contains("SNAT-CHAIN") && !l.contains("CONNMARK-CHAIN")),
        );
        assert!(host.update_snat(&external).await.unwrap().is_noop());
        host.update_snat(&snat()).await.unwrap();
        assert_one_connmark(&ns, Backend::Nft, ConnmarkBackend::Nftables);
    }

    /// A probe table of the test's own in the node: counts packets forwarded from the pod's
    /// veth, those of them carrying fwmark `0x80`, and replies arriving on eth0 whose
    /// connection carries ct mark `0x80`.
    const PROBE: &str = "table ip probe {
  chain forwarded {
    type filter hook forward priority 0; policy accept;
    iifname \"enitest0\" counter
    iifname \"enitest0\" meta mark & 0x80 == 0x80 counter
    iifname \"eth0\" ct mark & 0x80 == 0x80 counter
  }
}
";

    fn probe_counts(ns: &Ns) -> [u64; 3] {
        let listing = ns.exec(&["nft", "list", "chain", "ip", "probe", "forwarded"]);
        let counts: Vec<u64> = listing
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "packets")
            .map(|w| w[1].parse().unwrap())
            .collect();
        counts
            .try_into()
            .unwrap_or_else(|c| panic!("{c:?}\n{listing}"))
    }

    fn reset_probe(ns: &Ns) {
        // Rule counters (nft 1.0.6 has no `reset rules`): the probe is laid anew.
        ns.nft_f(&format!("delete table ip probe\n{PROBE}"));
    }

    /// One TCP connection pod → `addr` (served in `peer`), a few bytes each way.
    fn tcp_round_trip(pod: &Ns, peer: &Ns, addr: SocketAddr) {
        use std::io::{Read, Write};
        let listen = NetNs::named(&peer.name).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            listen
                .run(move || {
                    let l = TcpListener::bind(addr).expect("bind in peer");
                    tx.send(()).unwrap();
                    let (mut c, _) = l.accept().expect("accept");
                    let mut buf = [0u8; 4];
                    c.read_exact(&mut buf).unwrap();
                    c.write_all(b"pong").unwrap();
                })
                .unwrap();
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("listener up");
        NetNs::named(&pod.name)
            .unwrap()
            .run(move || {
                let mut s =
                    TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
                s.write_all(b"ping").unwrap();
                let mut buf = [0u8; 4];
                s.read_exact(&mut buf).unwrap();
                assert_eq!(&buf, b"pong");
            })
            .unwrap();
        server.join().unwrap();
    }

    /// pod (198.18.0.50) --enitest0-- node (eth0 198.18.0.10/24) --- peer (198.18.0.1 in the
    /// VPC, 203.0.113.1 outside): a connection to outside the VPC CIDRs is marked (its
    /// connection gets ct mark 0x80, every packet of the pod's gets fwmark 0x80 back: the first
    /// from the connmark restore, later ones from mangle's), a connection to the VPC is not.
    async fn marked_connections(backend: Backend) {
        let Some(node) = Ns::new("tnode") else { return };
        let (Some(pod), Some(peer)) = (Ns::new("tpod"), Ns::new("tpeer")) else {
            return;
        };
        node.ip(&format!(
            "link add eth0 address {PRIMARY_MAC} type veth peer name up0 netns {}",
            peer.name
        ));
        node.ip(&format!(
            "link add enitest0 type veth peer name eth0 netns {}",
            pod.name
        ));
        for cmd in [
            "addr add 198.18.0.10/24 dev eth0",
            "link set eth0 up",
            "link set enitest0 up",
            "route add 198.18.0.50/32 dev enitest0 scope link",
            "route add default via 198.18.0.1 dev eth0",
        ] {
            node.ip(cmd);
        }
        node.exec(&["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]);
        node.exec(&["sysctl", "-q", "-w", "net.ipv4.conf.enitest0.proxy_arp=1"]);
        for cmd in [
            "addr add 198.18.0.50/32 dev eth0",
            "link set eth0 up",
            "route add 169.254.1.1 dev eth0 scope link",
            "route add default via 169.254.1.1 dev eth0",
        ] {
            pod.ip(cmd);
        }
        for cmd in [
            "addr add 198.18.0.1/24 dev up0",
            "addr add 203.0.113.1/32 dev up0",
            "link set up0 up",
            "route add 198.18.0.50/32 via 198.18.0.10",
        ] {
            peer.ip(cmd);
        }
        let host = node.host(BackendChoice::Fixed(backend)).await;
        let applied = host.setup_node(&node_spec()).await.unwrap();
        let want = ConnmarkBackend::for_iptables(backend);
        assert_eq!(applied.connmark_backend, Some(want));
        assert_one_connmark(&node, backend, want);
        node.nft_f(PROBE);

        // Outside the VPC: marked.
        tcp_round_trip(&pod, &peer, "203.0.113.1:18081".parse().unwrap());
        let [from_pod, marked, replies_marked] = probe_counts(&node);
        assert!(from_pod >= 3, "SYN, ACK, data at least: {from_pod}");
        assert_eq!(
            marked, from_pod,
            "every packet from the pod carries fwmark 0x80"
        );
        assert!(
            replies_marked >= 2,
            "replies belong to a ct-marked connection: {replies_marked}"
        );
        if want == ConnmarkBackend::Nftables {
            let t = node.exec(&["nft", "list", "table", "ip", "aws-cni"]);
            let set_mark_hits = t
                .lines()
                .find(|l| l.contains("ct mark set ct mark |"))
                .and_then(|l| l.split_whitespace().skip_while(|w| *w != "packets").nth(1))
                .and_then(|n| n.parse::<u64>().ok());
            assert_eq!(set_mark_hits, Some(1), "one new connection marked:\n{t}");
        }

        // Inside the VPC: not marked.
        reset_probe(&node);
        tcp_round_trip(&pod, &peer, "198.18.0.1:18082".parse().unwrap());
        let [from_pod, marked, replies_marked] = probe_counts(&node);
        assert!(from_pod >= 3, "{from_pod}");
        assert_eq!(
            (marked, replies_marked),
            (0, 0),
            "a VPC connection is not marked"
        );
    }

    #[tokio::test]
    async fn connections_to_outside_the_vpc_are_marked_nf_tables() {
        marked_connections(Backend::Nft).await;
    }

    #[tokio::test]
    async fn connections_to_outside_the_vpc_are_marked_legacy() {
        marked_connections(Backend::Legacy).await;
    }
}
