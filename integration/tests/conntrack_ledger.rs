//! Kernel tests of the conntrack ledger (`ipamd::flows`) in a throwaway namespace: a handout
//! walks the table only when an entry may name its addresses. The first handout of an address
//! walks; the next one is answered from the ledger; an entry made since (its event) forces a
//! walk that deletes it; a released address an entry names is walked in the background; with
//! `net.netfilter.nf_conntrack_events=0` every handout walks. Everything runs in a namespace
//! created here (`ctl-<pid>-...`); nothing in the root namespace.

#[cfg(test)]
mod kernel {
    use std::net::{IpAddr, SocketAddr, UdpSocket};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use dataplane::NetNs;
    use integration::{can_run_kernel_tests, supervisor};
    use ipamd::flows::{self, FlowStats, Flows, Handout};
    use ipamd::host::{BackendChoice, Exec, HostNetwork};
    use tokio_util::sync::CancellationToken;

    const PREFIX: &str = "ctl-";

    struct Ns {
        name: String,
    }

    impl Ns {
        fn new() -> Self {
            supervisor::remove_stale_netns(PREFIX);
            let name = format!("{PREFIX}{}", std::process::id());
            supervisor::add_netns(&name).unwrap_or_else(|e| panic!("{e}"));
            let ns = Self { name };
            ns.sh(&["ip", "link", "set", "lo", "up"]);
            // 198.18.0.0/24 is local (an address on lo with its prefix): datagrams to any of it stay
            // in the namespace and each new flow makes a conntrack entry, which a NAT table in use
            // makes the namespace track.
            ns.sh(&["ip", "addr", "add", "198.18.0.1/24", "dev", "lo"]);
            ns.sh(&[
                "iptables",
                "-t",
                "nat",
                "-A",
                "POSTROUTING",
                "-d",
                "203.0.113.0/24",
                "-j",
                "MASQUERADE",
            ]);
            ns
        }

        fn sh(&self, argv: &[&str]) {
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", &self.name])
                .args(argv)
                .output()
                .expect("spawn");
            assert!(
                out.status.success(),
                "{argv:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }

        /// One datagram from 198.18.0.1 to `to`: a new conntrack entry naming both.
        fn flow_to(&self, to: &str, port: u16) {
            let ns = NetNs::named(&self.name).unwrap();
            let to: SocketAddr = format!("{to}:{port}").parse().unwrap();
            ns.run(move || {
                let s = UdpSocket::bind("198.18.0.1:0").unwrap();
                s.send_to(b"x", to).unwrap();
            })
            .unwrap();
        }

        async fn host(&self) -> HostNetwork {
            let ns = NetNs::named(&self.name).expect("open test netns");
            let netlink = ns.connect().await.expect("netlink in test netns");
            HostNetwork::new(
                netlink,
                Arc::new(Exec::in_netns(&self.name)),
                Arc::new(NetNs::named(&self.name).unwrap()),
                BackendChoice::Auto,
            )
            .with_conntrack(ns)
        }
    }

    impl Drop for Ns {
        fn drop(&mut self) {
            supervisor::delete_netns(&self.name);
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    async fn handout(flows: &Flows, a: &str) -> Handout {
        flows.before_handout(vec![ip(a)]).await.expect("handout")
    }

    async fn until(flows: &Flows, what: impl Fn(FlowStats) -> bool) -> FlowStats {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let s = flows.stats();
            if what(s) || Instant::now() > deadline {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handout_walks_the_table_only_when_an_entry_may_name_its_address() {
        if !can_run_kernel_tests() {
            return;
        }
        let ns = Ns::new();
        let host = Arc::new(ns.host().await);
        let stop = CancellationToken::new();
        // The index's free addresses: none at first, one later (the background sweep).
        let free: Arc<std::sync::Mutex<Vec<IpAddr>>> = Arc::default();
        let source = free.clone();
        let (flows, task) = flows::start(
            host,
            Arc::new(move || source.lock().unwrap().clone()),
            &stop,
        );
        let running = tokio::spawn(task.into_work());
        // Entries made before the subscription settles are never proved absent.
        tokio::time::sleep(Duration::from_millis(200)).await;

        assert!(
            matches!(handout(&flows, "198.18.0.5").await, Handout::Walked(_)),
            "first handout: nothing proved yet"
        );
        assert_eq!(flows.stats().walks, 1);
        assert_eq!(
            handout(&flows, "198.18.0.5").await,
            Handout::Clean,
            "walked, and no entry since"
        );
        assert_eq!(flows.stats().walks, 1, "no second walk");

        // A flow to the address: its entry's event makes it dirty; the handout's walk deletes it.
        ns.flow_to("198.18.0.5", 9);
        match handout(&flows, "198.18.0.5").await {
            Handout::Walked(f) => assert!(f.deleted >= 1, "the flow's entry was deleted: {f:?}"),
            Handout::Clean => panic!("an entry named the address, yet no walk"),
        }
        assert_eq!(handout(&flows, "198.18.0.5").await, Handout::Clean);
        // Another address's entry does not dirty this one.
        ns.flow_to("198.18.0.6", 9);
        assert_eq!(handout(&flows, "198.18.0.5").await, Handout::Clean);

        // Released while an entry names it: walked in the background, then handed out clean.
        ns.flow_to("198.18.0.5", 10);
        let before = flows.stats().walks;
        flows.released(vec![ip("198.18.0.5")]);
        let after = until(&flows, |s| s.walks > before).await;
        assert_eq!(
            after.walks,
            before + 1,
            "a background walk for the released address"
        );
        assert_eq!(
            handout(&flows, "198.18.0.5").await,
            Handout::Clean,
            "cleaned in the background"
        );

        // Released clean: no background walk.
        flows.released(vec![ip("198.18.0.5")]);
        tokio::time::sleep(Duration::from_millis(1300)).await;
        assert_eq!(flows.stats().walks, after.walks);

        // A free address never handed out is swept into a background walk: its first handout
        // finds it clean.
        let before = flows.stats().walks;
        free.lock().unwrap().push(ip("198.18.0.9"));
        let after = until(&flows, |s| s.walks > before).await;
        assert_eq!(
            after.walks,
            before + 1,
            "a background walk for the free address"
        );
        assert_eq!(handout(&flows, "198.18.0.9").await, Handout::Clean);
        free.lock().unwrap().clear();

        // Events switched off: nothing is proved, every handout walks.
        ns.sh(&["sysctl", "-qw", "net.netfilter.nf_conntrack_events=0"]);
        assert!(matches!(
            handout(&flows, "198.18.0.5").await,
            Handout::Walked(_)
        ));
        assert!(matches!(
            handout(&flows, "198.18.0.5").await,
            Handout::Walked(_)
        ));

        stop.cancel();
        running.await.unwrap().unwrap();
    }
}
