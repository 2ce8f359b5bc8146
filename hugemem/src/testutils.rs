//! Test helpers: what the kernel says about a mapping (`/proc/self/smaps`, the THP mode).

/// The `/proc/self/smaps` entry (header and fields) of the mapping that contains `addr`.
pub fn smaps_entry(addr: usize) -> Option<String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let lines: Vec<&str> = smaps.lines().collect();
    let at = lines.iter().position(|l| {
        let Some((range, _)) = l.split_once(' ') else {
            return false;
        };
        let Some((a, b)) = range.split_once('-') else {
            return false;
        };
        match (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
            (Ok(a), Ok(b)) => (a..b).contains(&addr),
            _ => false,
        }
    })?;
    // The header, then its fields ("Key: value"; keys start with a capital letter, headers
    // with a lower-case hex address).
    let fields = lines[at + 1..]
        .iter()
        .take_while(|l| l.starts_with(|c: char| c.is_ascii_uppercase()));
    Some(
        std::iter::once(&lines[at])
            .chain(fields)
            .copied()
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// The `[start, end)` of a smaps entry's header.
pub fn range_of(entry: &str) -> Option<(usize, usize)> {
    let (range, _) = entry.lines().next()?.split_once(' ')?;
    let (a, b) = range.split_once('-')?;
    Some((
        usize::from_str_radix(a, 16).ok()?,
        usize::from_str_radix(b, 16).ok()?,
    ))
}

/// Whether the entry's mapping was advised to use huge pages (`hg` in `VmFlags`).
pub fn advised_huge(entry: &str) -> bool {
    entry
        .lines()
        .any(|l| l.starts_with("VmFlags:") && l.split_whitespace().any(|f| f == "hg"))
}

/// The kernel's THP mode (`always`, `madvise`, `never`), if it has THP.
pub fn thp_mode() -> Option<String> {
    let t = std::fs::read_to_string(crate::THP_ENABLED).ok()?;
    crate::thp_mode_of(&t).map(str::to_string)
}
