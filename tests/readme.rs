//! README.md stays true to the code: its configuration table holds every variable of
//! `config::VARS` with the same default and meaning (what `rivet config` prints), and its sections
//! come in the order users need them.

use nccl_net_rivet::config::VARS;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap()
}

/// `[text](target)` → `text`.
fn unlink(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('[') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        match after.find("](").and_then(|j| after[j..].find(')').map(|k| (j, j + k))) {
            Some((j, k)) => {
                out.push_str(&after[..j]);
                rest = &after[k + 1..];
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out + rest
}

#[test]
fn configuration_table_matches_the_code() {
    let text = readme();
    let rows: Vec<(String, String, String)> = text
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.strip_prefix("| `")?.strip_suffix(" |")?.splitn(3, " | ").collect();
            let [name, default, meaning] = cells[..] else { return None };
            Some((name.trim_end_matches('`').to_string(), default.trim_matches('`').to_string(), unlink(meaning)))
        })
        .filter(|(n, _, _)| n.chars().all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit()))
        .collect();
    for v in VARS {
        let row = rows.iter().find(|(n, _, _)| n == v.name).unwrap_or_else(|| panic!("README's configuration table lacks {}", v.name));
        assert_eq!(row.1, v.default, "default of {}", v.name);
        assert_eq!(row.2, v.meaning, "meaning of {} (README vs src/config.rs)", v.name);
    }
    for (n, _, _) in &rows {
        assert!(VARS.iter().any(|v| v.name == n), "README documents {n}, which src/config.rs does not know");
    }
}

#[test]
fn sections_in_the_order_users_need_them() {
    let text = readme();
    let heads: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("## ")).collect();
    let want = ["Quick start", "Using it with NCCL", "GPU buffers", "Configuration", "The `rivet` CLI", "Troubleshooting"];
    let pos: Vec<usize> = want
        .iter()
        .map(|w| heads.iter().position(|h| h.starts_with(w)).unwrap_or_else(|| panic!("no section {w:?} in {heads:?}")))
        .collect();
    assert!(pos.windows(2).all(|p| p[0] < p[1]), "sections out of order: {heads:?}");
    // Using it with NCCL covers what a training job needs.
    for sub in ["### nccl-tests", "### PyTorch, Slurm and MPI", "### Containers", "### Is rivet in use?", "### Rolling back"] {
        assert!(text.contains(sub), "README lacks {sub}");
    }
}
