//! libvirt domain XML for vgpu.
//!
//! libvirt has no element for a vhost-user vsock device or QEMU's generic
//! vhost-user device, so a VM's vgpu device goes through QEMU's namespace
//! (`<qemu:commandline>`). [`attach`] adds to a domain what a VM needs and
//! [`detach`] takes it away again; both are idempotent:
//!
//! - guest memory in a shared memfd (`<memoryBacking><source type='memfd'/>
//!   <access mode='shared'/>`): vgpud maps the guest's memory;
//! - `<features><acpi/>` on x86: without it libvirt 9.0 passes `-no-acpi`,
//!   which QEMU 10 refuses;
//! - a `-chardev` on the VM's vhost-user socket and the device on it, at an
//!   explicit address on the root bus (`bus=pcie.0,addr=…` on q35):
//!   without one, QEMU's choice collides with libvirt's PCIe root ports;
//! - a `<metadata>` element in vgpu's namespace recording the attached VMs
//!   and what was added for them, so [`detach`] restores the domain.

use std::ops::Range;

use roxmltree::{Document, Node};
use thiserror::Error;

/// QEMU's libvirt namespace.
pub const QEMU_NS: &str = "http://libvirt.org/schemas/domain/qemu/1.0";
/// vgpu's metadata namespace.
pub const VGPU_NS: &str = "https://github.com/vgpu-project/vgpu/libvirt/1";
/// Virtqueues, queue size and config size of the virtio-vgpu device.
pub const VGPU_QUEUES: usize = 2;
/// See [`VGPU_QUEUES`].
pub const VGPU_QUEUE_SIZE: u16 = 1024;
/// See [`VGPU_QUEUES`].
pub const VGPU_CONFIG_SIZE: usize = 96;
/// The highest root-bus slot vgpu devices take (slot 0x1f is the q35 LPC/SATA/SMBus).
pub const TOP_SLOT: u8 = 0x1e;

/// Why a domain cannot be changed.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum XmlError {
    /// Not XML.
    #[error("the domain XML does not parse: {0}")]
    Parse(String),
    /// Not a libvirt domain.
    #[error("the XML is not a libvirt domain (its root is <{0}>)")]
    NotADomain(String),
    /// The domain's memory is private: vgpud cannot map it.
    #[error(
        "the domain's memory has <access mode='{0}'/>: vhost-user devices need shared guest memory; remove it or set mode='shared'"
    )]
    PrivateMemory(String),
    /// Anonymous memory cannot be shared.
    #[error(
        "the domain's memory has <source type='anonymous'/>, which cannot be shared with vgpud: remove it or use type='memfd'"
    )]
    AnonymousMemory,
    /// Every root-bus slot is taken.
    #[error("no free slot on the domain's root PCI bus for the vgpu device")]
    NoSlot,
}

/// The device vgpud serves on the VM's vhost-user socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// vhost-user vsock (stock guests).
    Vsock,
    /// The virtio-vgpu device with this virtio device ID.
    Vgpu {
        /// Virtio device ID (21 with QEMU).
        device_id: u16,
    },
}

/// One vgpu VM to attach to a domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// vgpud's VM name.
    pub vm: String,
    /// The VM's vhost-user socket, as QEMU sees it.
    pub socket: String,
    /// The device.
    pub model: Model,
}

impl Attachment {
    fn chardev(&self) -> String {
        format!("vgpu-{}", self.vm)
    }

    /// The QEMU arguments, with the device on `bus` at `slot`.
    pub fn qemu_args(&self, bus: &str, slot: u8) -> [String; 4] {
        let chr = self.chardev();
        let dev = match self.model {
            Model::Vsock => format!("vhost-user-vsock-pci,chardev={chr}"),
            Model::Vgpu { device_id } => format!(
                "vhost-user-test-device-pci,chardev={chr},virtio-id={device_id},num_vqs={VGPU_QUEUES},vq_size={VGPU_QUEUE_SIZE},config_size={VGPU_CONFIG_SIZE}"
            ),
        };
        [
            "-chardev".into(),
            format!("socket,id={chr},path={}", self.socket.replace(',', ",,")),
            "-device".into(),
            format!("{dev},id={chr}-dev,bus={bus},addr={slot:#04x}"),
        ]
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&apos;")
        .replace('"', "&quot;")
}

/// Applies (range, replacement) edits to `src`.
fn apply(src: &str, mut edits: Vec<(Range<usize>, String)>) -> String {
    edits.sort_by(|a, b| b.0.start.cmp(&a.0.start).then(b.0.end.cmp(&a.0.end)));
    let mut out = src.to_string();
    for (r, text) in edits {
        out.replace_range(r, &text);
    }
    out
}

fn parse(xml: &str) -> Result<Document<'_>, XmlError> {
    let doc = Document::parse(xml).map_err(|e| XmlError::Parse(e.to_string()))?;
    let root = doc.root_element();
    if root.tag_name().name() != "domain" {
        return Err(XmlError::NotADomain(root.tag_name().name().to_string()));
    }
    Ok(doc)
}

fn child<'a, 'i>(n: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    n.children().find(|c| {
        c.is_element() && c.tag_name().name() == name && c.tag_name().namespace().is_none()
    })
}

fn ns_child<'a, 'i>(n: Node<'a, 'i>, ns: &str, name: &str) -> Option<Node<'a, 'i>> {
    n.children().find(|c| {
        c.is_element() && c.tag_name().name() == name && c.tag_name().namespace() == Some(ns)
    })
}

/// The element's text from its start to its end tag (exclusive), for
/// inserting children: the position of `</name>`, or None if it is empty (`<x/>`).
fn end_tag_start(xml: &str, n: Node<'_, '_>) -> Option<usize> {
    let r = n.range();
    let text = &xml[r.clone()];
    if text.ends_with("/>") {
        None
    } else {
        text.rfind("</").map(|i| r.start + i)
    }
}

/// Inserts `inner` as the last content of `n`.
fn append_child(xml: &str, n: Node<'_, '_>, inner: &str) -> (Range<usize>, String) {
    match end_tag_start(xml, n) {
        Some(p) => (p..p, inner.to_string()),
        None => {
            let r = n.range();
            let open = &xml[r.start..r.end - 2];
            let name = &xml[r.start + 1..]
                .split(|c: char| c.is_whitespace() || c == '/' || c == '>')
                .next()
                .unwrap_or_default()
                .to_string();
            (r, format!("{}>{inner}</{name}>", open.trim_end()))
        }
    }
}

/// The VMs attached to a domain (from vgpu's metadata).
pub fn attached(xml: &str) -> Result<Vec<String>, XmlError> {
    let doc = parse(xml)?;
    let root = doc.root_element();
    Ok(child(root, "metadata")
        .and_then(|m| ns_child(m, VGPU_NS, "vgpu"))
        .map(|v| {
            v.children()
                .filter(|c| c.is_element() && c.tag_name().name() == "vm")
                .filter_map(|c| c.attribute("name").map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

/// The QEMU arguments of a domain, in order.
pub fn qemu_args(xml: &str) -> Result<Vec<String>, XmlError> {
    let doc = parse(xml)?;
    Ok(ns_child(doc.root_element(), QEMU_NS, "commandline")
        .map(|c| {
            c.children()
                .filter(|a| a.is_element() && a.tag_name().name() == "arg")
                .filter_map(|a| a.attribute("value").map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

fn is_x86(root: Node<'_, '_>) -> bool {
    let arch = child(root, "os")
        .and_then(|o| child(o, "type"))
        .and_then(|t| t.attribute("arch"));
    arch.is_none_or(|a| matches!(a, "x86_64" | "i686"))
}

/// The root bus: `pcie.0` on q35 (and when the machine is not said), `pci.0` on i440fx.
fn root_bus(root: Node<'_, '_>) -> &'static str {
    let machine = child(root, "os")
        .and_then(|o| child(o, "type"))
        .and_then(|t| t.attribute("machine"))
        .unwrap_or("q35");
    if machine.starts_with("pc") && !machine.contains("q35") {
        "pci.0"
    } else {
        "pcie.0"
    }
}

fn parse_num(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Root-bus slots in use: explicit `<address type='pci' bus='0'>`s and the
/// `addr=` of QEMU arguments on the root bus.
fn used_slots(root: Node<'_, '_>, bus: &str) -> Vec<u8> {
    let mut used = vec![0u8, 0x1f];
    for a in root.descendants().filter(|n| n.has_tag_name("address")) {
        if a.attribute("type") == Some("pci")
            && a.attribute("bus").and_then(parse_num) == Some(0)
            && !a.ancestors().any(|p| p.has_tag_name("source"))
            && let Some(s) = a.attribute("slot").and_then(parse_num)
        {
            used.push(s as u8);
        }
    }
    if let Some(c) = ns_child(root, QEMU_NS, "commandline") {
        for v in c.children().filter_map(|a| a.attribute("value")) {
            if v.contains(&format!("bus={bus}"))
                && let Some(addr) = v.split(',').find_map(|kv| kv.strip_prefix("addr="))
                && let Some(s) = parse_num(addr.split('.').next().unwrap_or(addr))
            {
                used.push(s as u8);
            }
        }
    }
    used
}

/// Whether the domain already has `a` as [`attach`] would add it: the VM
/// recorded with the same socket, its device's arguments, shared memory.
/// libvirt rewrites the XML it is given (formatting, addresses, element
/// order), so this compares meaning, not text.
pub fn is_attached(xml: &str, a: &Attachment) -> Result<bool, XmlError> {
    let doc = parse(xml)?;
    let root = doc.root_element();
    let recorded = child(root, "metadata")
        .and_then(|m| ns_child(m, VGPU_NS, "vgpu"))
        .is_some_and(|v| {
            v.children().any(|c| {
                c.tag_name().name() == "vm"
                    && c.attribute("name") == Some(a.vm.as_str())
                    && c.attribute("socket") == Some(a.socket.as_str())
            })
        });
    let shared = child(root, "memoryBacking").is_some_and(|mb| {
        child(mb, "access").and_then(|x| x.attribute("mode")) == Some("shared")
            && child(mb, "source").is_some()
    });
    let args = qemu_args(xml)?;
    let want = a.qemu_args("", 0);
    let chardev = args
        .windows(2)
        .any(|w| w[0] == "-chardev" && w[1] == want[1]);
    let prefix = want[3].split(",id=").next().unwrap_or_default().to_string();
    let device = args
        .windows(2)
        .any(|w| w[0] == "-device" && w[1].starts_with(&format!("{prefix},")));
    Ok(recorded && shared && chardev && device)
}

/// Adds `a` to the domain (replacing an earlier attachment of the same VM).
pub fn attach(xml: &str, a: &Attachment) -> Result<String, XmlError> {
    let xml = detach(xml, &a.vm)?;
    let doc = parse(&xml)?;
    let root = doc.root_element();
    let mut edits = Vec::new();
    let mut added = Vec::new();

    let qemu = match root.lookup_prefix(QEMU_NS) {
        Some(p) => p.to_string(),
        None => {
            let p = root.range().start + "<domain".len();
            edits.push((p..p, format!(" xmlns:qemu='{QEMU_NS}'")));
            "qemu".to_string()
        }
    };

    // Shared guest memory.
    match child(root, "memoryBacking") {
        None => {
            let after = child(root, "currentMemory")
                .or_else(|| child(root, "memory"))
                .map_or_else(
                    || end_tag_start(&xml, root).unwrap_or(xml.len()),
                    |m| m.range().end,
                );
            edits.push((
                after..after,
                "\n  <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>"
                    .into(),
            ));
            added.push("memoryBacking");
        }
        Some(mb) => {
            let mut inner = String::new();
            match child(mb, "source").and_then(|s| s.attribute("type")) {
                Some("anonymous") => return Err(XmlError::AnonymousMemory),
                Some(_) => {}
                None => {
                    inner.push_str("<source type='memfd'/>");
                    added.push("source");
                }
            }
            match child(mb, "access").and_then(|s| s.attribute("mode")) {
                Some("shared") => {}
                Some(m) => return Err(XmlError::PrivateMemory(m.to_string())),
                None => {
                    inner.push_str("<access mode='shared'/>");
                    added.push("access");
                }
            }
            if !inner.is_empty() {
                edits.push(append_child(&xml, mb, &inner));
            }
        }
    }

    // ACPI on x86 (libvirt 9.0 passes -no-acpi otherwise; QEMU 10 refuses it).
    if is_x86(root) {
        match child(root, "features") {
            Some(f) if child(f, "acpi").is_none() => {
                edits.push(append_child(&xml, f, "<acpi/>"));
                added.push("acpi");
            }
            Some(_) => {}
            None => {
                let p = child(root, "os").map_or(root.range().start, |o| o.range().end);
                edits.push((p..p, "\n  <features><acpi/></features>".into()));
                added.push("features");
            }
        }
    }

    // The device, at an explicit free slot of the root bus.
    let bus = root_bus(root);
    let used = used_slots(root, bus);
    let slot = (3..=TOP_SLOT)
        .rev()
        .find(|s| !used.contains(s))
        .ok_or(XmlError::NoSlot)?;
    let args: String = a
        .qemu_args(bus, slot)
        .iter()
        .map(|v| format!("\n    <{qemu}:arg value='{}'/>", esc(v)))
        .collect();
    match ns_child(root, QEMU_NS, "commandline") {
        Some(c) => edits.push(append_child(&xml, c, &format!("{args}\n  "))),
        None => {
            let p = end_tag_start(&xml, root).unwrap_or(xml.len());
            edits.push((
                p..p,
                format!("  <{qemu}:commandline>{args}\n  </{qemu}:commandline>\n"),
            ));
        }
    }

    // What was done, for detach.
    let vm_el = format!(
        "<vgpu:vm name='{}' socket='{}' slot='{slot:#04x}'/>",
        esc(&a.vm),
        esc(&a.socket)
    );
    match child(root, "metadata") {
        Some(m) => match ns_child(m, VGPU_NS, "vgpu") {
            Some(v) => edits.push(append_child(&xml, v, &vm_el)),
            None => edits.push(append_child(
                &xml,
                m,
                &format!(
                    "<vgpu:vgpu xmlns:vgpu='{VGPU_NS}' added='{}'>{vm_el}</vgpu:vgpu>",
                    added.join(" ")
                ),
            )),
        },
        None => {
            let p = child(root, "uuid")
                .or_else(|| child(root, "name"))
                .map_or(root.range().start, |n| n.range().end);
            edits.push((
                p..p,
                format!(
                    "\n  <metadata><vgpu:vgpu xmlns:vgpu='{VGPU_NS}' added='{}'>{vm_el}</vgpu:vgpu></metadata>",
                    added.join(" ")
                ),
            ));
        }
    }
    // Adding to an existing attachment keeps the first one's record.
    Ok(apply(&xml, edits))
}

/// Removes VM `vm` from the domain; when it was the last vgpu VM, also what
/// was added for vgpu (except ACPI, which the domain needs with libvirt 9
/// and QEMU 10 anyway).
pub fn detach(xml: &str, vm: &str) -> Result<String, XmlError> {
    let doc = parse(xml)?;
    let root = doc.root_element();
    let chr = format!("vgpu-{vm}");
    let mut edits = Vec::new();
    let mut remaining_args = 0;
    if let Some(c) = ns_child(root, QEMU_NS, "commandline") {
        let args: Vec<Node> = c
            .children()
            .filter(|a| a.is_element() && a.tag_name().name() == "arg")
            .collect();
        let ours = |v: &str| {
            v.starts_with(&format!("socket,id={chr},"))
                || v.split(',').any(|kv| kv == format!("chardev={chr}"))
        };
        let mut i = 0;
        while i < args.len() {
            let v = args[i].attribute("value").unwrap_or_default();
            let next = args.get(i + 1).and_then(|n| n.attribute("value"));
            if matches!(v, "-chardev" | "-device") && next.is_some_and(ours) {
                edits.push((with_leading_space(xml, args[i].range()), String::new()));
                edits.push((with_leading_space(xml, args[i + 1].range()), String::new()));
                i += 2;
            } else {
                remaining_args += 1;
                i += 1;
            }
        }
        if remaining_args == 0 && !edits.is_empty() {
            edits.clear();
            edits.push((with_leading_space(xml, c.range()), String::new()));
        }
    }
    let meta = child(root, "metadata").and_then(|m| ns_child(m, VGPU_NS, "vgpu").map(|v| (m, v)));
    if let Some((m, v)) = meta {
        let vms: Vec<Node> = v
            .children()
            .filter(|c| c.is_element() && c.tag_name().name() == "vm")
            .collect();
        let mine: Vec<&Node> = vms
            .iter()
            .filter(|c| c.attribute("name") == Some(vm))
            .collect();
        if !mine.is_empty() && mine.len() == vms.len() {
            // The last vgpu VM: undo what was added for vgpu.
            let added: Vec<&str> = v
                .attribute("added")
                .unwrap_or_default()
                .split(' ')
                .collect();
            if let Some(mb) = child(root, "memoryBacking") {
                if added.contains(&"memoryBacking") {
                    edits.push((with_leading_space(xml, mb.range()), String::new()));
                } else {
                    for (what, el) in [("source", "source"), ("access", "access")] {
                        if added.contains(&what)
                            && let Some(e) = child(mb, el)
                        {
                            edits.push((e.range(), String::new()));
                        }
                    }
                }
            }
            let only_ours = m.children().filter(|c| c.is_element()).count() == 1;
            if only_ours {
                edits.push((with_leading_space(xml, m.range()), String::new()));
            } else {
                edits.push((v.range(), String::new()));
            }
        } else {
            for c in mine {
                edits.push((c.range(), String::new()));
            }
        }
    }
    Ok(apply(xml, edits))
}

/// `r` extended over the whitespace before it (so removals leave no blank lines).
fn with_leading_space(xml: &str, r: Range<usize>) -> Range<usize> {
    let before = &xml[..r.start];
    let trimmed = before.trim_end_matches([' ', '\t']);
    let start = trimmed
        .strip_suffix('\n')
        .map_or(trimmed.len(), |t| t.len());
    start..r.end
}

/// The elements `attach` adds to an empty q35 domain, as a snippet to paste
/// into a domain by hand (`vgpuctl vm attach-args NAME --vmm libvirt`).
pub fn snippet(a: &Attachment) -> String {
    let minimal = "<domain type='kvm'>\n  <name>NAME</name>\n  <memory unit='GiB'>2</memory>\n  <os><type arch='x86_64' machine='q35'>hvm</type></os>\n</domain>\n";
    attach(minimal, a).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vsock(vm: &str) -> Attachment {
        Attachment {
            vm: vm.into(),
            socket: format!("/run/vgpu/{vm}.vhost.sock"),
            model: Model::Vsock,
        }
    }

    const DOMAIN: &str = "<domain type='kvm'>
  <name>d1</name>
  <uuid>6c1c4e8e-7d0d-4e49-9d38-4a8f1f2f7e11</uuid>
  <memory unit='KiB'>1048576</memory>
  <currentMemory unit='KiB'>1048576</currentMemory>
  <os>
    <type arch='x86_64' machine='pc-q35-7.2'>hvm</type>
  </os>
  <features>
    <pae/>
  </features>
  <devices>
    <controller type='pci' index='1' model='pcie-root-port'>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x1e' function='0x0'/>
    </controller>
  </devices>
</domain>
";

    #[test]
    fn attach_adds_shared_memory_acpi_and_the_device_at_a_free_slot() {
        let x = attach(DOMAIN, &vsock("vm1")).unwrap();
        let doc = Document::parse(&x).unwrap();
        let root = doc.root_element();
        let mb = child(root, "memoryBacking").unwrap();
        assert_eq!(
            child(mb, "source").unwrap().attribute("type"),
            Some("memfd")
        );
        assert_eq!(
            child(mb, "access").unwrap().attribute("mode"),
            Some("shared")
        );
        let f = child(root, "features").unwrap();
        assert!(child(f, "acpi").is_some() && child(f, "pae").is_some());
        let args = qemu_args(&x).unwrap();
        assert_eq!(
            args,
            [
                "-chardev",
                "socket,id=vgpu-vm1,path=/run/vgpu/vm1.vhost.sock",
                "-device",
                // 0x1e is taken by the root port: the next one down.
                "vhost-user-vsock-pci,chardev=vgpu-vm1,id=vgpu-vm1-dev,bus=pcie.0,addr=0x1d"
            ]
        );
        assert_eq!(attached(&x).unwrap(), ["vm1"]);
    }

    #[test]
    fn attach_is_idempotent_and_detach_restores_the_domain() {
        let once = attach(DOMAIN, &vsock("vm1")).unwrap();
        let twice = attach(&once, &vsock("vm1")).unwrap();
        assert_eq!(qemu_args(&twice).unwrap(), qemu_args(&once).unwrap());
        assert_eq!(attached(&twice).unwrap(), ["vm1"]);
        assert!(is_attached(&twice, &vsock("vm1")).unwrap());
        assert!(!is_attached(DOMAIN, &vsock("vm1")).unwrap());
        let mut moved = vsock("vm1");
        moved.socket = "/elsewhere.sock".into();
        assert!(
            !is_attached(&twice, &moved).unwrap(),
            "a new socket is a change"
        );
        let back = detach(&twice, "vm1").unwrap();
        assert!(qemu_args(&back).unwrap().is_empty());
        assert!(attached(&back).unwrap().is_empty());
        let doc = Document::parse(&back).unwrap();
        assert!(child(doc.root_element(), "memoryBacking").is_none());
        assert!(child(doc.root_element(), "metadata").is_none());
        assert_eq!(
            detach(&back, "vm1").unwrap(),
            back,
            "detaching twice changes nothing"
        );
    }

    #[test]
    fn two_vms_get_two_slots_and_the_shared_settings_stay_until_the_last_goes() {
        let x = attach(&attach(DOMAIN, &vsock("a")).unwrap(), &vsock("b")).unwrap();
        let args = qemu_args(&x).unwrap();
        assert!(
            args[3].ends_with("addr=0x1d") && args[7].ends_with("addr=0x1c"),
            "{args:?}"
        );
        assert_eq!(attached(&x).unwrap(), ["a", "b"]);
        let x = detach(&x, "a").unwrap();
        assert_eq!(attached(&x).unwrap(), ["b"]);
        assert!(x.contains("<access mode='shared'/>"));
        let x = detach(&x, "b").unwrap();
        assert!(!x.contains("memoryBacking"));
    }

    #[test]
    fn existing_settings_are_kept_and_private_memory_is_refused() {
        let d = DOMAIN.replace(
            "<currentMemory",
            "<memoryBacking>\n    <hugepages/>\n  </memoryBacking>\n  <currentMemory",
        );
        let x = attach(&d, &vsock("vm1")).unwrap();
        assert!(x.contains("<hugepages/>") && x.contains("<access mode='shared'/>"));
        let back = detach(&x, "vm1").unwrap();
        assert!(
            back.contains("<hugepages/>") && !back.contains("memfd") && !back.contains("access")
        );
        let private = DOMAIN.replace(
            "<currentMemory",
            "<memoryBacking><access mode='private'/></memoryBacking><currentMemory",
        );
        assert_eq!(
            attach(&private, &vsock("vm1")).unwrap_err(),
            XmlError::PrivateMemory("private".into())
        );
        assert!(matches!(
            attach("<x/>", &vsock("a")),
            Err(XmlError::NotADomain(_))
        ));
    }

    #[test]
    fn the_vgpu_model_and_odd_paths() {
        let a = Attachment {
            vm: "g".into(),
            socket: "/run/a,b'.sock".into(),
            model: Model::Vgpu { device_id: 21 },
        };
        let x = attach(DOMAIN, &a).unwrap();
        let args = qemu_args(&x).unwrap();
        assert_eq!(args[1], "socket,id=vgpu-g,path=/run/a,,b'.sock");
        assert!(
            args[3].starts_with("vhost-user-test-device-pci,chardev=vgpu-g,virtio-id=21,num_vqs=2")
        );
        let s = snippet(&vsock("vm1"));
        assert!(
            s.contains("xmlns:qemu") && s.contains("<acpi/>") && s.contains("memfd"),
            "{s}"
        );
    }
}
