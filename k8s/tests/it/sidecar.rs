//! The KubeVirt hook sidecar: its domain XML transformation on samples of
//! virt-launcher's output (tests/fixtures), and its gRPC services (Info,
//! OnDefineDomain) as virt-launcher calls them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use roxmltree::{Document, Node};
use vgpu_k8s::api::hooks_info as info;
use vgpu_k8s::api::hooks_v1alpha2 as v1alpha2;
use vgpu_k8s::plugin::unix_channel;
use vgpu_k8s::sidecar::{self, Hooks};

const QEMU_NS: &str = "http://libvirt.org/schemas/domain/qemu/1.0";

fn fixture(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn el<'a, 'i>(n: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    n.children()
        .find(|c| c.is_element() && c.tag_name().name() == name)
}

fn qemu_args(doc: &Document) -> Vec<String> {
    doc.root_element()
        .children()
        .filter(|c| {
            c.tag_name().namespace() == Some(QEMU_NS) && c.tag_name().name() == "commandline"
        })
        .flat_map(|c| c.children())
        .filter(|a| a.tag_name().name() == "arg")
        .filter_map(|a| a.attribute("value").map(str::to_string))
        .collect()
}

#[test]
fn a_vmi_with_one_slot_gets_shared_memory_and_one_vsock_device() {
    let xml = fixture("containerdisk.xml");
    let out =
        sidecar::on_define_domain(&xml, fixture("vmi-q4.json").as_bytes(), "vgpu.io").unwrap();
    let doc = Document::parse(&out).expect("the result is XML");
    let root = doc.root_element();
    let mb = el(root, "memoryBacking").expect("memoryBacking");
    assert_eq!(el(mb, "source").unwrap().attribute("type"), Some("memfd"));
    assert_eq!(el(mb, "access").unwrap().attribute("mode"), Some("shared"));
    let args = qemu_args(&doc);
    assert_eq!(args.len(), 4, "{args:?}");
    assert_eq!(args[0], "-chardev");
    assert_eq!(
        args[1],
        "socket,id=vgpu-slot0,path=/var/run/vgpu/0/vhost.sock"
    );
    assert!(
        args[3].starts_with("vhost-user-vsock-pci,chardev=vgpu-slot0"),
        "{args:?}"
    );
    assert!(
        args[3].contains("bus=pcie.0,addr=0x1e"),
        "an explicit root-bus slot: {args:?}"
    );
    // What KubeVirt put there is kept: its metadata, disks, network, ACPI.
    let meta = el(root, "metadata").unwrap();
    assert!(
        meta.children()
            .any(|c| c.tag_name().namespace() == Some("http://kubevirt.io"))
    );
    let devices = el(root, "devices").unwrap();
    assert_eq!(
        devices
            .children()
            .filter(|c| c.has_tag_name("disk"))
            .count(),
        2
    );
    assert!(el(devices, "interface").is_some());
    assert_eq!(el(el(root, "features").unwrap(), "acpi").iter().count(), 1);
    // The original text is still there, untouched.
    for line in xml
        .lines()
        .filter(|l| l.contains("<disk") || l.contains("<source file"))
    {
        assert!(out.contains(line), "{line} is kept");
    }
}

#[test]
fn huge_pages_and_an_existing_commandline_are_kept_with_two_vgpu_devices() {
    let xml = fixture("hugepages.xml");
    let out =
        sidecar::on_define_domain(&xml, fixture("vmi-two-q8.json").as_bytes(), "vgpu.io").unwrap();
    let doc = Document::parse(&out).unwrap();
    let root = doc.root_element();
    let mb = el(root, "memoryBacking").unwrap();
    assert!(el(mb, "hugepages").is_some(), "huge pages stay");
    assert_eq!(el(mb, "access").unwrap().attribute("mode"), Some("shared"));
    let cmd: Vec<Node> = root
        .children()
        .filter(|c| {
            c.tag_name().namespace() == Some(QEMU_NS) && c.tag_name().name() == "commandline"
        })
        .collect();
    assert_eq!(cmd.len(), 1, "one commandline element");
    assert!(
        cmd[0].children().any(|c| c.tag_name().name() == "env"),
        "KubeVirt's env stays"
    );
    let args = qemu_args(&doc);
    assert_eq!(args.len(), 8, "{args:?}");
    assert_eq!(
        args[1],
        "socket,id=vgpu-slot0,path=/var/run/vgpu/0/vhost.sock"
    );
    assert_eq!(
        args[5],
        "socket,id=vgpu-slot1,path=/var/run/vgpu/1/vhost.sock"
    );
    for a in [&args[3], &args[7]] {
        assert!(
            a.starts_with("vhost-user-test-device-pci,") && a.contains("virtio-id=21"),
            "{a}"
        );
    }
    assert_ne!(
        args[3].rsplit("addr=").next(),
        args[7].rsplit("addr=").next(),
        "two slots"
    );
}

#[test]
fn a_vmi_without_vgpu_resources_is_left_alone_and_bad_annotations_are_refused() {
    let xml = fixture("containerdisk.xml");
    let out =
        sidecar::on_define_domain(&xml, fixture("vmi-none.json").as_bytes(), "vgpu.io").unwrap();
    assert_eq!(out, xml);
    let bad = fixture("vmi-q4.json").replace(
        "\"annotations\": {",
        "\"annotations\": {\"vgpu.io/device-model\": \"gpu\",",
    );
    let e = sidecar::on_define_domain(&xml, bad.as_bytes(), "vgpu.io").unwrap_err();
    assert!(e.to_string().contains("use \"vsock\""), "{e}");
}

#[tokio::test]
async fn virt_launcher_can_ask_info_and_call_on_define_domain() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("hooks/vgpu.sock");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let s2 = sock.clone();
    let server = tokio::spawn(async move {
        sidecar::serve(
            &s2,
            Hooks {
                domain: "vgpu.io".into(),
            },
            async {
                let _ = stopped.await;
            },
        )
        .await
    });
    wait_socket(&sock).await;
    let ch = unix_channel(&sock).await.unwrap();
    let i = info::info_client::InfoClient::new(ch.clone())
        .info(info::InfoParams {
            supported_info_versions: vec!["v1alpha1".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(i.name, "vgpu");
    assert_eq!(i.versions, ["v1alpha2"]);
    assert_eq!(i.hook_points[0].name, "OnDefineDomain");
    let r = v1alpha2::callbacks_client::CallbacksClient::new(ch)
        .on_define_domain(v1alpha2::OnDefineDomainParams {
            domain_xml: fixture("containerdisk.xml").into_bytes(),
            vmi: fixture("vmi-q4.json").into_bytes(),
        })
        .await
        .unwrap()
        .into_inner();
    let out = String::from_utf8(r.domain_xml).unwrap();
    assert!(out.contains("/var/run/vgpu/0/vhost.sock"));
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

async fn wait_socket(p: &Path) {
    for _ in 0..200 {
        if p.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} did not appear", p.display());
}
