//! `vgpuctl vm attach NAME --domain DOMAIN` and `vm detach`: a VM's vgpu
//! device in a defined libvirt domain, through `virsh` (`dumpxml`, the
//! change from [`vgpu_libvirt`], `define`). Both are idempotent; the domain
//! sees the change at its next start.
//!
//! libvirt's QEMU runs as an unprivileged user (`libvirt-qemu` on Debian):
//! `attach` gives the VM's sockets to that user (mode 0660) when it cannot
//! reach them, and says how to make that permanent (`socket_owner`).

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use clap::Args;
use serde_json::json;
use vgpu_libvirt::{Attachment, Model};

use crate::api::{Client, typed};
use crate::outcome::{CliError, print_json};
use crate::vm_transport::VmTransport;

/// libvirt's system URI.
pub const DEFAULT_URI: &str = "qemu:///system";

/// Arguments of `vm attach` and `vm detach`.
#[derive(Debug, Args)]
pub struct DomainArgs {
    /// VM name (in vgpud).
    pub name: String,
    /// The libvirt domain (name or UUID), already defined.
    #[arg(long)]
    pub domain: String,
    /// libvirt connection URI.
    #[arg(long, short = 'c', env = "LIBVIRT_DEFAULT_URI", default_value = DEFAULT_URI)]
    pub connect: String,
    /// The user libvirt runs QEMU as (default: qemu.conf's `user`, else libvirt-qemu or qemu).
    #[arg(long)]
    pub qemu_user: Option<String>,
}

/// The attachment of a VM, from its running config.
pub fn attachment(vm: &VmTransport) -> Result<Attachment, String> {
    let Some(socket) = &vm.vhost_user_socket else {
        return Err(format!(
            "VM {} has no vhost-user device: add vhost_user_socket and guest_cid (vsock) or device_model = \"vgpu\" to its [[vm]] entry; libvirt's QEMU attaches to vgpud through it",
            vm.name
        ));
    };
    let model = match vm.vgpu_device_id {
        Some(id) if !vgpu_config::qemu_presents_device_id(id) => {
            return Err(format!(
                "VM {} uses virtio device ID {id}, which QEMU cannot present: set vgpu_device_id = {} in its [[vm]] entry",
                vm.name,
                vgpu_config::QEMU_VGPU_DEVICE_ID
            ));
        }
        Some(device_id) => Model::Vgpu { device_id },
        None => Model::Vsock,
    };
    Ok(Attachment {
        vm: vm.name.clone(),
        socket: socket.clone(),
        model,
    })
}

fn virsh(uri: &str, args: &[&str]) -> Result<String, CliError> {
    let out = Command::new("virsh")
        .arg("-c")
        .arg(uri)
        .args(args)
        .output()
        .map_err(|e| {
            CliError::Failed(format!(
                "cannot run virsh ({e}): install libvirt's clients (Debian: apt-get install libvirt-clients)"
            ))
        })?;
    if !out.status.success() {
        return Err(CliError::Failed(format!(
            "virsh {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Defines `xml` (the domain's new persistent definition).
fn define(uri: &str, xml: &str) -> Result<(), CliError> {
    let mut f = tempfile_in_tmp()?;
    f.1.write_all(xml.as_bytes())
        .map_err(|e| CliError::Failed(format!("cannot write the domain XML: {e}")))?;
    let path = f.0.clone();
    let r = virsh(uri, &["define", &path]);
    let _ = std::fs::remove_file(&path);
    r.map(|_| ())
}

fn tempfile_in_tmp() -> Result<(String, std::fs::File), CliError> {
    let path = std::env::temp_dir().join(format!("vgpuctl-domain-{}.xml", std::process::id()));
    let f = std::fs::File::create(&path)
        .map_err(|e| CliError::Failed(format!("cannot create {}: {e}", path.display())))?;
    Ok((path.to_string_lossy().into_owned(), f))
}

/// The user libvirt's QEMU runs as.
pub fn qemu_user(explicit: Option<&str>) -> String {
    if let Some(u) = explicit {
        return u.to_string();
    }
    if let Ok(conf) = std::fs::read_to_string("/etc/libvirt/qemu.conf") {
        for l in conf.lines() {
            let l = l.trim();
            if let Some(v) = l.strip_prefix("user")
                && let Some(v) = v.trim_start().strip_prefix('=')
            {
                let v = v.trim().trim_matches('"');
                if !v.is_empty() {
                    return v.trim_start_matches('+').to_string();
                }
            }
        }
    }
    if user_ids("libvirt-qemu").is_some() {
        "libvirt-qemu".into()
    } else {
        "qemu".into()
    }
}

fn user_ids(user: &str) -> Option<(u32, u32)> {
    if let Ok(n) = user.parse::<u32>() {
        return Some((n, n));
    }
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 3 && f[0] == user).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}

/// Whether `uid`/`gid` may connect to the socket at `p` (write permission).
fn can_connect(p: &Path, uid: u32, gid: u32) -> bool {
    let Ok(m) = std::fs::metadata(p) else {
        return false;
    };
    let mode = m.permissions().mode();
    uid == 0
        || (m.uid() == uid && mode & 0o200 != 0)
        || (m.gid() == gid && mode & 0o020 != 0)
        || mode & 0o002 != 0
}

/// Runs `vm attach`.
pub fn attach(a: &DomainArgs, c: &Client, json_out: bool) -> Result<(), CliError> {
    let vm = VmTransport::from_vm(&typed(&c.get(&format!("/v1/vms/{}", a.name))?)?);
    let att = attachment(&vm).map_err(CliError::Failed)?;
    let before = virsh(
        &a.connect,
        &["dumpxml", "--inactive", "--security-info", &a.domain],
    )?;
    let err = |e: vgpu_libvirt::XmlError| CliError::Failed(format!("domain {}: {e}", a.domain));
    let changed = !vgpu_libvirt::is_attached(&before, &att).map_err(err)?;
    let after = if changed {
        vgpu_libvirt::attach(&before, &att).map_err(err)?
    } else {
        before.clone()
    };
    if changed {
        define(&a.connect, &after)?;
    }
    // libvirt's QEMU must be able to connect to the socket.
    let mut socket_note = None;
    if a.connect.ends_with("/system") {
        let user = qemu_user(a.qemu_user.as_deref());
        let sock = Path::new(&att.socket);
        match user_ids(&user) {
            Some((uid, gid)) if !can_connect(sock, uid, gid) => {
                std::os::unix::fs::chown(sock, Some(uid), Some(gid))
                    .and_then(|()| std::fs::set_permissions(sock, std::fs::Permissions::from_mode(0o660)))
                    .map_err(|e| {
                        CliError::Failed(format!(
                            "libvirt's QEMU runs as {user}, who cannot connect to {}, and giving it to {user} failed: {e}; set socket_owner = \"{user}\" in the VM's [[vm]] entry",
                            sock.display()
                        ))
                    })?;
                socket_note = Some(format!(
                    "gave {} to {user} (mode 0660) so libvirt's QEMU can connect; to keep that across vgpud restarts, set socket_owner = \"{user}\" in the VM's [[vm]] entry",
                    sock.display()
                ));
            }
            Some(_) => {}
            None => {
                socket_note = Some(format!(
                    "no user {user} on this host: make sure the user libvirt runs QEMU as can connect to {}",
                    sock.display()
                ));
            }
        }
    }
    if json_out {
        print_json(&json!({
            "vm": a.name, "domain": a.domain, "changed": changed,
            "qemu_args": vgpu_libvirt::qemu_args(&after).unwrap_or_default(),
            "note": socket_note,
        }));
    } else {
        if changed {
            println!(
                "VM {} attached to domain {} (takes effect at its next start)",
                a.name, a.domain
            );
        } else {
            println!("VM {} was already attached to domain {}", a.name, a.domain);
        }
        if let Some(n) = socket_note {
            eprintln!("note: {n}");
        }
    }
    Ok(())
}

/// Runs `vm detach`.
pub fn detach(a: &DomainArgs, _c: &Client, json_out: bool) -> Result<(), CliError> {
    let before = virsh(
        &a.connect,
        &["dumpxml", "--inactive", "--security-info", &a.domain],
    )?;
    let err = |e: vgpu_libvirt::XmlError| CliError::Failed(format!("domain {}: {e}", a.domain));
    let changed = vgpu_libvirt::attached(&before)
        .map_err(err)?
        .contains(&a.name)
        || vgpu_libvirt::qemu_args(&before)
            .map_err(err)?
            .iter()
            .any(|v| v.contains(&format!("id=vgpu-{},", a.name)));
    let after = vgpu_libvirt::detach(&before, &a.name).map_err(err)?;
    if changed {
        define(&a.connect, &after)?;
    }
    if json_out {
        print_json(&json!({ "vm": a.name, "domain": a.domain, "changed": changed }));
    } else if changed {
        println!(
            "VM {} detached from domain {} (takes effect at its next start)",
            a.name, a.domain
        );
    } else {
        println!("VM {} was not attached to domain {}", a.name, a.domain);
    }
    Ok(())
}
