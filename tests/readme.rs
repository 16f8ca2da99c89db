//! README.md stays true to the code: its configuration table holds the variables users set
//! (`config::USER_SET`) and docs/configuration.md every variable of `config::VARS`, each with the
//! default and meaning `rivet config` prints; and its sections come in the order users need them.

use nccl_net_rivet::config::{USER_SET, VARS};

mod common;

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

/// The rows `| `NAME` | `default` | meaning |` of a Markdown text.
fn var_rows(text: &str) -> Vec<(String, String, String)> {
    text.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.strip_prefix("| `")?.strip_suffix(" |")?.splitn(3, " | ").collect();
            let [name, default, meaning] = cells[..] else { return None };
            Some((name.trim_end_matches('`').to_string(), default.trim_matches('`').to_string(), unlink(meaning)))
        })
        .filter(|(n, _, _)| n.chars().all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit()))
        .collect()
}

/// Each row as the code has it, and exactly the rows `names` (in any order).
fn check_rows(doc: &str, rows: &[(String, String, String)], names: &[&str]) {
    for n in names {
        let v = VARS.iter().find(|v| v.name == *n).unwrap();
        let row = rows.iter().find(|(r, _, _)| r == n).unwrap_or_else(|| panic!("{doc}'s configuration table lacks {n}"));
        assert_eq!(row.1, v.default, "default of {n} ({doc} vs src/config/vars.rs)");
        assert_eq!(row.2, v.meaning, "meaning of {n} ({doc} vs src/config/vars.rs)");
    }
    for (n, _, _) in rows {
        assert!(names.contains(&n.as_str()), "{doc} has a row for {n}, which is not among the variables it should list");
    }
}

#[test]
fn configuration_tables_match_the_code() {
    // README: the variables users set; docs/configuration.md: every variable rivet reads (its
    // first table; the CLI's and the tests' variables follow in tables of their own).
    let text = readme();
    let section = text.split("\n## Configuration").nth(1).expect("a Configuration section").split("\n## ").next().unwrap();
    check_rows("README.md", &var_rows(section), USER_SET);
    let full = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md")).unwrap();
    let first = full.split("\n## ").nth(1).expect("docs/configuration.md: a first section");
    let all: Vec<&str> = VARS.iter().map(|v| v.name).collect();
    check_rows("docs/configuration.md", &var_rows(first), &all);
}

#[test]
fn sections_in_the_order_users_need_them() {
    let text = readme();
    let heads: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("## ")).collect();
    let want = ["Contents", "Quick start", "Using it with NCCL", "Migrating", "GPU buffers", "Configuration", "The `rivet` CLI", "Troubleshooting"];
    let pos: Vec<usize> = want
        .iter()
        .map(|w| heads.iter().position(|h| h.starts_with(w)).unwrap_or_else(|| panic!("no section {w:?} in {heads:?}")))
        .collect();
    assert!(pos.windows(2).all(|p| p[0] < p[1]), "sections out of order: {heads:?}");
    // Using it with NCCL covers what a training job needs.
    for sub in [
        "### nccl-tests",
        "### PyTorch, Slurm and MPI",
        "### Containers",
        "### Settings in `/etc/nccl.conf`",
        "### Checking a fleet",
        "### Is rivet in use?",
        "### Rolling back",
        "### Getting GPUDirect RDMA",
        "### Common failures",
    ] {
        assert!(text.contains(sub), "README lacks {sub}");
    }
    // What has been proven where, before anything else.
    let first = text.find("\n## ").unwrap();
    assert!(text[..first].contains("**Status.**") && text[..first].contains("| tested with |"), "README's status is not at the top");
    // Every link of the table of contents leads to a heading.
    let contents = text.split("\n## Contents").nth(1).unwrap().split("\n## ").next().unwrap();
    let anchors: Vec<String> = text.lines().filter(|l| l.starts_with('#')).map(anchor).collect();
    for link in contents.split("](#").skip(1).map(|l| l.split(')').next().unwrap()) {
        assert!(anchors.iter().any(|a| a == link), "the contents link #{link} leads nowhere (headings: {anchors:?})");
    }
}

/// GitHub's anchor of a heading line: lower case, spaces to dashes, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The README's container recipe, as far as this machine allows (no container engine runs here):
/// its Dockerfile's `ADD` and `ENV` lines applied to the release layout (the tarball's
/// `lib/libnccl-net-rivet.so` and `bin/rivet` under a stand-in for `/opt`), then the command its
/// `docker run` gives the image, with the image's environment only. The doctor's self-test moves
/// data through the library that `NCCL_NET_PLUGIN` names.
#[test]
fn the_container_recipe_runs_its_command_in_the_image_layout() {
    let text = readme();
    let dockerfile = text.split("```dockerfile\n").nth(1).expect("a Dockerfile in the README").split("```").next().unwrap();
    let version = env!("CARGO_PKG_VERSION");
    let tarball = format!("rivet-{version}-x86_64-linux.tar.gz");
    assert!(dockerfile.contains(&format!("ADD {tarball} /opt/")), "the Dockerfile adds this version's tarball:\n{dockerfile}");
    let env_line = dockerfile.replace("\\\n", " ");
    let env_line = env_line.lines().find(|l| l.starts_with("ENV ")).expect("an ENV line");
    let root = std::env::temp_dir().join(format!("rivet-image-{}", std::process::id()));
    let opt = root.join("opt");
    let top = opt.join(format!("rivet-{version}-x86_64-linux"));
    std::fs::create_dir_all(top.join("lib")).unwrap();
    std::fs::create_dir_all(top.join("bin")).unwrap();
    let built = std::path::Path::new(env!("CARGO_BIN_EXE_rivet")).parent().unwrap().to_path_buf();
    std::fs::copy(common::cdylib(), top.join("lib/libnccl-net-rivet.so")).unwrap();
    std::fs::copy(built.join("rivet"), top.join("bin/rivet")).unwrap();
    let mut env: Vec<(String, String)> = Vec::new();
    for kv in env_line["ENV ".len()..].split_whitespace() {
        let (k, v) = kv.split_once('=').unwrap();
        let v = v.replace("/opt/", &format!("{}/", opt.display())).replace("${PATH}", "/usr/bin:/bin");
        env.push((k.to_string(), v));
    }
    assert!(env.iter().any(|(k, v)| k == "NCCL_NET_PLUGIN" && std::path::Path::new(v).is_file()), "NCCL_NET_PLUGIN names the library in the image: {env:?}");
    let run = text.split("docker run ").nth(1).expect("a docker run command").split("```").next().unwrap().replace("\\\n", " ");
    let cmd: Vec<&str> = run.split_whitespace().skip_while(|w| *w != "train-rivet").skip(1).collect();
    assert_eq!(cmd.first(), Some(&"rivet"), "docker run's command: {run}");
    let mut c = std::process::Command::new(cmd[0]);
    c.args(&cmd[1..]).env_clear().env("NCCL_SOCKET_IFNAME", "lo");
    for (k, v) in &env {
        c.env(k, v);
    }
    let out = c.output().expect("the image's rivet on its PATH");
    let all = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("== Self-test: OK"), "{all}");
    let _ = std::fs::remove_dir_all(&root);
}

