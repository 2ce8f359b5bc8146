//! The container images (scripts/build-image.sh, docs/kubernetes.md): built offline with umoci
//! from this test profile's binaries under the names deploy/ uses, checked with skopeo (config,
//! labels, layer digests), unpacked with umoci, and run from the unpacked rootfs with chroot
//! (or `unshare --root` without root): `vgpud --check-config` on the ConfigMap's config, a real
//! vgpud with a simulated GPU serving its admin socket inside the rootfs, `vgpuctl status` from
//! the same rootfs and the plugin's admin client from outside talking to it, and the plugin's and
//! the sidecar's `--help`. A library missing from the image fails the run from the rootfs.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use vgpu_k8s::admin::AdminClient;

use crate::manifests::documents;

/// How long vgpud, started from the image, may take to open its admin socket.
const START_WAIT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(50);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `target/<profile>`: the test binary is in its `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// Runs a command, panicking with its output unless it succeeds.
fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} does not run: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(out: Output) -> Value {
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

/// Whether the test runs as root (`/proc/self` belongs to the effective user).
fn root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The path of a host tool (the command inside the rootfs gets the rootfs's `PATH`, which
/// Command would also search for the tool).
fn host_tool(name: &str) -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is missing (util-linux, coreutils)"))
}

/// A command run inside `rootfs`: chroot as root, else in a user namespace.
fn in_rootfs(rootfs: &Path, args: &[&str]) -> Command {
    let mut cmd = if root() {
        let mut c = Command::new(host_tool("chroot"));
        c.arg(rootfs);
        c
    } else {
        let mut c = Command::new(host_tool("unshare"));
        c.args(["--user", "--map-root-user", "--mount"])
            .arg(format!("--root={}", rootfs.display()));
        c
    };
    cmd.args(args).env_clear().env("PATH", "/usr/local/bin");
    cmd
}

/// vgpud, the plugin and vgpuctl built in this profile (the plugin and the sidecar are built
/// with this test; vgpud and vgpuctl come from other packages).
fn build_binaries(profile: &Path) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace()).args([
        "build",
        "-q",
        "-p",
        "vgpud",
        "-p",
        "vgpu-host-tools",
        "-p",
        "vgpu-k8s",
        "--bins",
    ]);
    if profile.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    if let Some(target) = profile.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    run(&mut cmd);
}

/// `name:tag` split at the tag's colon.
fn split(image: &str) -> (&str, &str) {
    image.rsplit_once(':').expect("an image with a tag")
}

/// Every blob the manifest of `layout:tag` names is in the layout with that digest and size.
fn verify_blobs(layout: &Path, tag: &str) -> Vec<String> {
    let manifest = json(run(Command::new("skopeo")
        .args(["inspect", "--raw"])
        .arg(format!("oci:{}:{tag}", layout.display()))));
    let mut blobs = vec![manifest["config"].clone()];
    blobs.extend(manifest["layers"].as_array().unwrap().iter().cloned());
    let mut layers = Vec::new();
    for b in blobs {
        let digest = b["digest"].as_str().unwrap();
        let hex = digest.strip_prefix("sha256:").expect("sha256 digests");
        let path = layout.join("blobs/sha256").join(hex);
        let sum = run(Command::new("sha256sum").arg(&path));
        let sum = String::from_utf8_lossy(&sum.stdout);
        assert_eq!(
            sum.split_whitespace().next(),
            Some(hex),
            "{}",
            path.display()
        );
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            b["size"].as_u64().unwrap()
        );
        if b["mediaType"].as_str().is_some_and(|m| m.contains("layer")) {
            layers.push(digest.to_string());
        }
    }
    assert!(!layers.is_empty(), "{layout:?} has layers");
    layers
}

/// The image config, read back from the oci-archive by skopeo.
fn archive_config(archive: &Path) -> Value {
    json(run(Command::new("skopeo")
        .args(["inspect", "--config"])
        .arg(format!("oci-archive:{}", archive.display()))))["config"]
        .clone()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_image_built_offline_runs_vgpud_and_the_plugin_from_its_own_rootfs() {
    for tool in ["umoci", "skopeo", "sha256sum"] {
        assert!(
            Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .unwrap()
                .status
                .success(),
            "{tool} is missing: run scripts/prereqs.sh (it installs umoci and skopeo)"
        );
    }
    // The names deploy/ runs, tagged with the workspace's version.
    let ds = &documents("daemonset.yaml")[0];
    let containers = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    let image = containers[0]["image"].as_str().unwrap().to_string();
    assert!(containers.iter().all(|c| c["image"] == image.as_str()));
    let vmi = &documents("vmi.yaml")[0];
    let hooks: Value = serde_json::from_str(
        vmi["metadata"]["annotations"]["hooks.kubevirt.io/hookSidecars"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let sidecar_image = hooks[0]["image"].as_str().unwrap().to_string();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(split(&image).1, version, "{image}");
    assert_eq!(split(&sidecar_image).1, version, "{sidecar_image}");

    let profile = profile_dir();
    build_binaries(&profile);
    let out = tempfile::tempdir().unwrap();
    run(Command::new(workspace().join("scripts/build-image.sh"))
        .arg("--profile-dir")
        .arg(&profile)
        .arg("--out")
        .arg(out.path()));

    let mut layers = Vec::new();
    for (dir, name, entry) in [
        ("vgpu", &image, "/usr/local/bin/vgpud"),
        (
            "vgpu-kubevirt-sidecar",
            &sidecar_image,
            "/usr/local/bin/vgpu-kubevirt-sidecar",
        ),
    ] {
        let layout = out.path().join(dir);
        // Named in the index as deploy/ names it.
        let index: Value =
            serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
        let annotations = &index["manifests"][0]["annotations"];
        assert_eq!(annotations["io.containerd.image.name"], name.as_str());
        assert_eq!(annotations["org.opencontainers.image.ref.name"], version);
        layers.push(verify_blobs(&layout, version));
        let config = archive_config(&out.path().join(format!("{dir}-{version}.oci.tar")));
        assert_eq!(
            config["Labels"]["org.opencontainers.image.version"],
            version
        );
        assert_eq!(
            config["Labels"]["org.opencontainers.image.source"],
            env!("CARGO_PKG_REPOSITORY")
        );
        assert_eq!(config["Entrypoint"], serde_json::json!([entry]), "{name}");
    }
    // The sidecar image shares the main image's layer.
    assert_eq!(layers[0], layers[1]);

    // Unpacked as a runtime bundle: its process is the image's entrypoint and command.
    let bundle = out.path().join("bundle");
    let mut unpack = Command::new("umoci");
    unpack.arg("unpack");
    if !root() {
        unpack.arg("--rootless");
    }
    run(unpack
        .arg("--image")
        .arg(format!("{}:{version}", out.path().join("vgpu").display()))
        .arg(&bundle));
    let spec: Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    let args: Vec<&str> = spec["process"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        args,
        ["/usr/local/bin/vgpud", "--config", "/etc/vgpu/vgpud.toml"]
    );
    let rootfs = bundle.join("rootfs");

    // The ConfigMap's config, checked by the image's vgpud.
    let cm = &documents("configmap.yaml")[0];
    std::fs::write(
        rootfs.join("etc/vgpu/vgpud.toml"),
        cm["data"]["vgpud.toml"].as_str().unwrap(),
    )
    .unwrap();
    let check = run(&mut in_rootfs(
        &rootfs,
        &[args[0], "--check-config", args[2]],
    ));
    let check = String::from_utf8_lossy(&check.stdout);
    assert!(check.contains("valid (1 devices"), "{check}");

    // A real vgpud from the rootfs, a simulated GPU, its admin socket inside the rootfs.
    std::fs::write(
        rootfs.join("etc/vgpu/sim.toml"),
        "[admin]\nsocket = \"/run/vgpu/admin.sock\"\n\n\
         [[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"256MiB\"\nworkers = 1\n\n\
         [[profile]]\nname = \"q4\"\nmemory = \"1/4\"\nweight = 2\n",
    )
    .unwrap();
    let log = std::fs::File::create(out.path().join("vgpud.log")).unwrap();
    let mut vgpud = Killed(
        in_rootfs(&rootfs, &[args[0], "--config", "/etc/vgpu/sim.toml"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let socket = rootfs.join("run/vgpu/admin.sock");
    let deadline = Instant::now() + START_WAIT;
    while UnixStream::connect(&socket).is_err() {
        if let Some(status) = vgpud.0.try_wait().unwrap() {
            panic!(
                "vgpud from the image exited ({status}):\n{}",
                std::fs::read_to_string(out.path().join("vgpud.log")).unwrap()
            );
        }
        assert!(
            Instant::now() < deadline,
            "vgpud from the image did not open its admin socket in {START_WAIT:?}"
        );
        std::thread::sleep(POLL);
    }
    let status = run(&mut in_rootfs(
        &rootfs,
        &["vgpuctl", "--socket", "/run/vgpu/admin.sock", "status"],
    ));
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("gpu0"), "{status}");
    // The plugin's client, from outside, reads the same daemon's profiles.
    let profiles = AdminClient::new(&socket).profiles().unwrap();
    assert_eq!(profiles.len(), 1);
    assert_eq!(profiles[0].name, "q4");
    assert_eq!(profiles[0].devices.len(), 1);
    drop(vgpud);

    // The plugin and the sidecar start (they parse their arguments after loading).
    for bin in ["vgpu-device-plugin", "vgpu-kubevirt-sidecar"] {
        let help = run(&mut in_rootfs(&rootfs, &[bin, "--help"]));
        assert!(
            String::from_utf8_lossy(&help.stdout).contains("Usage"),
            "{bin}"
        );
    }
    // The sidecar with the arguments deploy/vmi.yaml has virt-launcher pass, on a VMI that asks
    // for vgpu.io/q4 (its --transform check mode: OnDefineDomain without the hook socket).
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    std::fs::copy(fixtures.join("vmi-q4.json"), rootfs.join("tmp/vmi.json")).unwrap();
    let hook_args: Vec<&str> = hooks[0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut sidecar_args = vec!["vgpu-kubevirt-sidecar"];
    sidecar_args.extend(&hook_args);
    sidecar_args.extend(["--transform", "/tmp/vmi.json"]);
    let domain = run(in_rootfs(&rootfs, &sidecar_args)
        .stdin(std::fs::File::open(fixtures.join("containerdisk.xml")).unwrap()));
    let domain = String::from_utf8_lossy(&domain.stdout);
    assert!(domain.contains("/var/run/vgpu/0/vhost.sock"), "{domain}");
}
