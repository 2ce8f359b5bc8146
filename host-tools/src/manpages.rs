//! Man pages generated from vgpuctl's command definitions (`clap_mangen`):
//! `vgpuctl.1` and one page per subcommand (`vgpuctl-vm-add.1`, …).

use std::path::{Path, PathBuf};

/// Writes the page of `cmd` and of every subcommand into `dir`; returns the files.
pub fn write_all(cmd: &clap::Command, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    write_page(cmd.clone(), cmd.get_name().to_string(), dir, &mut out)?;
    Ok(out)
}

fn write_page(
    cmd: clap::Command,
    name: String,
    dir: &Path,
    out: &mut Vec<PathBuf>,
) -> std::io::Result<()> {
    // Subcommand pages are named after their full path (`vgpuctl-vm-add`).
    let cmd = cmd.name(name.clone()).bin_name(name.replace('-', " "));
    let path = dir.join(format!("{name}.1"));
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut buf)?;
    std::fs::write(&path, buf)?;
    out.push(path);
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        write_page(sub.clone(), format!("{name}-{}", sub.get_name()), dir, out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::cli::Cli;

    #[test]
    fn every_command_gets_a_page_with_its_flags() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_all(&Cli::command(), dir.path()).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for want in [
            "vgpuctl.1",
            "vgpuctl-vm-add.1",
            "vgpuctl-top.1",
            "vgpuctl-doctor.1",
            "vgpuctl-device-set.1",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
        let add = std::fs::read_to_string(dir.path().join("vgpuctl-vm-add.1")).unwrap();
        assert!(add.starts_with(".ie") || add.contains(".TH"), "{add}");
        assert!(
            add.contains("memory") && add.contains("Memory slice"),
            "{add}"
        );
        let top = std::fs::read_to_string(dir.path().join("vgpuctl.1")).unwrap();
        assert!(
            top.contains("Exit codes"),
            "the exit codes are documented in the main page"
        );
    }
}
