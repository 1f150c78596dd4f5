//! A same-host peer in another network namespace that shares our mount namespace.

use std::path::Path;
use std::time::Duration;

use hixl::{Engine, HostBuffer, OpDesc};
use hixl_cli::child::Target;

use crate::client::connect;
use crate::netns::{enter_netns, in_namespace_b, NetGuard};
use crate::role::target_cmd;
use crate::IP_B;

/// A same-host peer in another network namespace but in our mount namespace (as `nsenter
/// --net`, or a launcher that only calls setns, leaves it): the fabric's abstract Unix socket
/// is per network namespace, so it cannot be reached, and with `hixl.Transport=auto` the
/// engine must fall back to TCP.
///
/// Ignored because it fails with this engine: the same-host check compares boot id and mount
/// namespace only, so the fabric is chosen, its socket refuses the connection
/// (ECONNREFUSED), and that error fails the whole connect instead of falling back.
pub(crate) fn auto_falls_back_to_tcp_for_a_peer_in_another_netns_sharing_our_mounts() {
    let Some(g) = NetGuard::create(
        "auto_falls_back_to_tcp_for_a_peer_in_another_netns_sharing_our_mounts",
        "mounts",
        &["ip"],
    ) else {
        return;
    };
    in_namespace_b(&g, |net| async move {
        // Started from a thread inside namespace A: the target shares our mount namespace.
        let a = net.a.clone();
        let target = std::thread::spawn(move || {
            enter_netns(&a).unwrap();
            let cmd = target_cmd(1 << 20);
            let args: Vec<&str> = cmd[1..].iter().map(String::as_str).collect();
            Target::spawn_with(Path::new(&cmd[0]), &args).unwrap()
        })
        .join()
        .unwrap();
        let e = Engine::builder(IP_B).build().await.unwrap();
        let local = e.register(HostBuffer::zeroed(1 << 20).unwrap()).unwrap();
        let peer = connect(&e, &target.engine).await;
        let kv = peer.region("kv").unwrap().addr;
        peer.write(&[OpDesc::new(local.addr(), kv, 1 << 20)])
            .timeout(Duration::from_secs(5))
            .await
            .unwrap();
        target.stop();
    });
}
