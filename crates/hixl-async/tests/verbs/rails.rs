//! Rails: transfers striped over two RDMA devices, one device's link taken down mid-transfer
//! and brought back, both down, and two ends with different MTUs. The devices come from
//! `HIXL_VERBS_RAILS` (the Soft-RoCE guest has rxe0 on dummy0, MTU 1500, and rxe1 on dummy1,
//! MTU 9000); the tests take their netdevs down and up with `ip link`. The MTU test's two ends
//! come from `HIXL_VERBS_MTU_PAIR` (in the guest rxe2 and rxe3, on a veth pair).

use std::process::Command;
use std::time::{Duration, Instant};

use hixl_async::{HostBuffer, Peer, RailInfo};
use hixl_core::OpDesc;

use crate::setup::{checksum, connect, engine, pattern, region_bytes, rt};
use crate::target::Target;
use crate::{MTU_PAIR_VAR, RAILS_VAR, T};

const BIG: usize = 64 << 20;

fn rail_devices(test: &str) -> Option<Vec<String>> {
    let v: Vec<String> = std::env::var(RAILS_VAR)
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if v.len() < 2 {
        eprintln!("{test}: skipped ({RAILS_VAR} does not name two devices; tools/verbs-tests.sh runs it in the Soft-RoCE guest)");
        return None;
    }
    Some(v)
}

/// The netdev under an RDMA device (RoCE: its GID table names it).
fn netdev(dev: &str) -> String {
    let p = format!("/sys/class/infiniband/{dev}/ports/1/gid_attrs/ndevs/0");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .trim()
        .to_owned()
}

fn set_link(netdev: &str, up: bool) {
    let st = Command::new("ip")
        .args(["link", "set", "dev", netdev, if up { "up" } else { "down" }])
        .status()
        .expect("ip link");
    assert!(st.success(), "ip link set dev {netdev}: {st}");
}

/// Brings the netdevs it took down back up, whatever happens to the test.
struct Downed(Vec<String>);

impl Downed {
    fn take(&mut self, netdev: String) {
        set_link(&netdev, false);
        self.0.push(netdev);
    }

    fn restore(&mut self) {
        for n in self.0.drain(..) {
            set_link(&n, true);
        }
    }
}

impl Drop for Downed {
    fn drop(&mut self) {
        self.restore();
    }
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Four descriptors over `len` bytes from `local` to `remote`.
fn quarters(local: u64, remote: u64, len: usize) -> Vec<OpDesc> {
    let q = len as u64 / 4;
    (0..4)
        .map(|i| OpDesc::new(local + i * q, remote + i * q, q))
        .collect()
}

fn show(p: &Peer) -> Vec<RailInfo> {
    let v = p.rails();
    for r in &v {
        println!("  {r}");
    }
    v
}

pub(crate) fn striped_64mib_write_and_read_over_two_rails_verified() {
    let Some(devs) = rail_devices("striped_64mib_write_and_read_over_two_rails") else {
        return;
    };
    let list = devs.join(",");
    let mut t = Target::spawn_with(&list, BIG);
    rt().block_on(async {
        let e = engine(&list).await;
        let local = e
            .register(HostBuffer::zeroed(BIG).expect("buffer"))
            .expect("register");
        let p = connect(&e, &t.addr).await;
        let rails = show(&p);
        assert_eq!(rails.len(), devs.len(), "one rail per device pair");
        assert!(rails.iter().all(|r| r.up && r.why.contains("same subnet")));
        let kv = p.region("kv").expect("kv");
        let descs = quarters(local.addr(), kv.addr, BIG);
        p.read(&descs).timeout(T).await.expect("read");
        let mut want = vec![0u8; BIG];
        pattern(1, 0, &mut want);
        assert!(region_bytes(&local, 0, BIG) == want, "READ of 64 MiB");
        let read = show(&p);
        pattern(2, 0, &mut want);
        local.write_at(0, &want).expect("fill");
        p.write(&descs).timeout(T).await.expect("write");
        assert_eq!(t.sum(0, BIG as u64), checksum(&want), "WRITE of 64 MiB");
        let after = show(&p);
        for (r, a) in read.iter().zip(&after) {
            assert!(r.bytes > 0, "the READ used no byte of rail {}", r.index);
            assert!(
                a.bytes > r.bytes,
                "the WRITE used no byte of rail {}",
                a.index
            );
            assert_eq!(a.errors, 0);
        }
        // Every byte landed once: no slice counted twice, none lost.
        let total: u64 = after.iter().map(|r| r.bytes).sum();
        assert_eq!(total, 2 * BIG as u64);
        let metrics = e.metrics_text();
        for r in &after {
            let line = format!("rail=\"{}\",local=\"{}\"", r.index, r.local);
            assert!(metrics.contains(&line), "metrics lack {line}:\n{metrics}");
        }
        e.shutdown(Duration::from_secs(1)).await;
    });
}

pub(crate) fn one_rail_down_mid_transfer_completes_on_the_other_and_comes_back() {
    let Some(devs) = rail_devices("one_rail_down_mid_transfer") else {
        return;
    };
    let list = devs.join(",");
    const LEN: usize = BIG / 2;
    let mut t = Target::spawn_with(&list, LEN);
    let mut down = Downed(Vec::new());
    rt().block_on(async {
        let e = engine(&list).await;
        let local = e
            .register(HostBuffer::zeroed(LEN).expect("buffer"))
            .expect("register");
        let p = connect(&e, &t.addr).await;
        let kv = p.region("kv").expect("kv");
        let descs = quarters(local.addr(), kv.addr, LEN);
        let mut want = vec![0u8; LEN];
        // Writes of 32 MiB back to back, each with new bytes; rail 1's link goes down once
        // the first has moved bytes on it. Every write must succeed, and at least one must
        // have had the rail paused while it ran (its slices there re-placed on rail 0).
        let (mut seed, mut taken, mut mid, mut after) = (10u64, false, 0, 0);
        while mid == 0 || after == 0 {
            assert!(seed < 40, "rail 1 was never paused during a write");
            pattern(seed, 0, &mut want);
            local.write_at(0, &want).expect("fill");
            let paused_before = !p.rails()[1].up;
            let w = {
                let (p, descs) = (p.clone(), descs.clone());
                tokio::spawn(async move { p.write(&descs).timeout(T).await })
            };
            if !taken {
                wait_until("rail 1 carries bytes", || p.rails()[1].bytes > 0).await;
                down.take(netdev(&devs[1]));
                println!("{} down mid-transfer", devs[1]);
                taken = true;
            }
            w.await.expect("task").expect("every write succeeds");
            assert_eq!(t.sum(0, LEN as u64), checksum(&want), "write {seed}");
            match (paused_before, !p.rails()[1].up) {
                (false, true) => mid += 1,
                (true, _) => after += 1,
                _ => {}
            }
            seed += 1;
        }
        let rails = show(&p);
        assert!(!rails[1].up && rails[1].pauses >= 1, "{}", rails[1]);
        println!(
            "{} writes verified, {mid} with the pause during it",
            seed - 10
        );
        // Back up: the rail is probed back and carries bytes again.
        down.restore();
        wait_until("rail 1 is back", || p.rails()[1].up).await;
        let before = show(&p)[1].bytes;
        pattern(99, 0, &mut want);
        local.write_at(0, &want).expect("fill");
        p.write(&descs).timeout(T).await.expect("write after");
        assert_eq!(t.sum(0, LEN as u64), checksum(&want));
        let rails = show(&p);
        assert!(
            rails[1].bytes > before,
            "rail 1 took nothing after coming back"
        );
        e.shutdown(Duration::from_secs(1)).await;
    });
}

pub(crate) fn both_down_fail_with_an_error_naming_each_rail() {
    let Some(devs) = rail_devices("both_down_fail_with_an_error") else {
        return;
    };
    let list = devs.join(",");
    let mut t = Target::spawn_with(&list, 8 << 20);
    let mut down = Downed(Vec::new());
    rt().block_on(async {
        let e = engine(&list).await;
        let local = e
            .register(HostBuffer::zeroed(8 << 20).expect("buffer"))
            .expect("register");
        let p = connect(&e, &t.addr).await;
        let kv = p.region("kv").expect("kv");
        let descs = quarters(local.addr(), kv.addr, 8 << 20);
        for d in &devs {
            down.take(netdev(d));
        }
        wait_until("every rail is paused", || p.rails().iter().all(|r| !r.up)).await;
        let started = Instant::now();
        let err = p
            .write(&descs)
            .timeout(T)
            .await
            .expect_err("no rail is left");
        let msg = err.to_string();
        println!("error after {:?}: {msg}", started.elapsed());
        assert!(msg.contains("no RDMA rail is left"), "{msg}");
        for d in &devs {
            assert!(
                msg.contains(d.as_str()),
                "the error does not name {d}: {msg}"
            );
        }
        assert!(!matches!(err, hixl_core::Error::Timeout { .. }), "{err:?}");
        assert!(p.is_connected(), "the link itself stays up");
        assert_eq!(e.ops_in_flight(), 0);
        down.restore();
        wait_until("every rail is back", || p.rails().iter().all(|r| r.up)).await;
        let mut want = vec![0u8; 8 << 20];
        pattern(5, 0, &mut want);
        local.write_at(0, &want).expect("fill");
        p.write(&descs).timeout(T).await.expect("write after");
        assert_eq!(t.sum(0, 8 << 20), checksum(&want));
        e.shutdown(Duration::from_secs(1)).await;
    });
}

/// The largest IB MTU RoCE fits in an Ethernet MTU.
fn ib_mtu(netdev_mtu: u32) -> u32 {
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|&m| m + 100 <= netdev_mtu)
        .unwrap_or(256)
}

/// A counter of a netdev (`/sys/class/net/<netdev>/statistics/<name>`, or `mtu`).
fn net_stat(netdev: &str, name: &str) -> u64 {
    let p = if name == "mtu" {
        format!("/sys/class/net/{netdev}/mtu")
    } else {
        format!("/sys/class/net/{netdev}/statistics/{name}")
    };
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{p}: {e}"))
}

pub(crate) fn different_mtus_are_negotiated() {
    // Two devices whose netdevs reach each other over a wire (not `lo`: two rxe devices on
    // local addresses do not reach each other through it), with different MTUs; in the guest,
    // the two ends of a veth pair with MTUs 1500 and 9000.
    let pair = std::env::var(MTU_PAIR_VAR).unwrap_or_default();
    let Some((near, far)) = pair.split_once(',') else {
        eprintln!("different_mtus_are_negotiated: skipped ({MTU_PAIR_VAR} does not name two devices; tools/verbs-tests.sh runs it in the Soft-RoCE guest)");
        return;
    };
    const LEN: usize = 8 << 20;
    let (near_net, far_net) = (netdev(near), netdev(far));
    let ours = ib_mtu(net_stat(&near_net, "mtu") as u32);
    let theirs = ib_mtu(net_stat(&far_net, "mtu") as u32);
    println!("{near} on {near_net}: active MTU {ours}; {far} on {far_net}: {theirs}");
    assert_ne!(
        ours, theirs,
        "the two devices have the same MTU: nothing to negotiate"
    );
    let agreed = ours.min(theirs);
    // The target has only the far device, we only the near one.
    let mut t = Target::spawn_with(far, LEN);
    rt().block_on(async {
        let e = engine(near).await;
        let local = e
            .register(HostBuffer::zeroed(LEN).expect("buffer"))
            .expect("register");
        let p = connect(&e, &t.addr).await;
        let rails = show(&p);
        assert_eq!(rails.len(), 1, "one device each: one rail");
        assert_eq!(
            (rails[0].local.as_str(), rails[0].remote.as_str()),
            (near, far)
        );
        assert_eq!(rails[0].mtu, agreed, "{}", rails[0]);
        let kv = p.region("kv").expect("kv");
        let descs = quarters(local.addr(), kv.addr, LEN);
        // READ: the far end sends the data. Every packet of it crossed our netdev, and it took
        // at least one per `agreed` bytes: the far end sent no packet of its own larger MTU.
        let (bytes0, pkts0) = (
            net_stat(&near_net, "rx_bytes"),
            net_stat(&near_net, "rx_packets"),
        );
        p.read(&descs).timeout(T).await.expect("read");
        let (bytes, pkts) = (
            net_stat(&near_net, "rx_bytes") - bytes0,
            net_stat(&near_net, "rx_packets") - pkts0,
        );
        println!("READ of {LEN} bytes: {bytes} bytes in {pkts} packets into {near_net}");
        assert!(bytes >= LEN as u64, "the READ did not cross {near_net}");
        assert!(pkts >= (LEN / agreed as usize) as u64, "{pkts} packets");
        let mut want = vec![0u8; LEN];
        pattern(1, 0, &mut want);
        assert!(region_bytes(&local, 0, LEN) == want, "READ of 8 MiB");
        // WRITE: we send the data.
        pattern(3, 0, &mut want);
        local.write_at(0, &want).expect("fill");
        let bytes0 = net_stat(&near_net, "tx_bytes");
        p.write(&descs).timeout(T).await.expect("write");
        let bytes = net_stat(&near_net, "tx_bytes") - bytes0;
        println!("WRITE of {LEN} bytes: {bytes} bytes out of {near_net}");
        assert!(bytes >= LEN as u64, "the WRITE did not cross {near_net}");
        assert_eq!(t.sum(0, LEN as u64), checksum(&want), "WRITE of 8 MiB");
        let rails = show(&p);
        assert_eq!(rails[0].errors, 0);
        e.shutdown(Duration::from_secs(1)).await;
    });
}
