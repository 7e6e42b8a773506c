//! Reading `cuobjdump -sass -res-usage` output: per architecture, each kernel's machine
//! instructions (address, predicate, opcode, branch target) and its resource usage
//! (registers, shared and local memory). Takes a fatbin's dump (one `Fatbin elf code`
//! section per architecture) or a single cubin's (`code for sm_XX`).
//!
//! The lines it reads look like this (each instruction is followed by a line holding the
//! rest of its encoding, which is skipped):
//!
//! ```text
//! Fatbin elf code:
//! arch = sm_90
//!  Function softmax_forward:
//!   REG:30 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:568 TEXTURE:0 SURFACE:0 SAMPLER:0
//!     code for sm_90
//!         Function : softmax_forward
//!         /*0090*/               @P0 EXIT ;                      /* 0x000000000000094d */
//!         /*0110*/              @!P0 BRA 0x2c0 ;                 /* 0x0000000000688947 */
//!         /*15b0*/                   BRA.DIV ~URZ, 0x7570 ;      /* 0x... */
//! ```

/// One machine instruction.
#[derive(Debug, Clone, PartialEq)]
pub struct Instr {
    pub addr: u32,
    /// The guard predicate without the `@` (`P0`, `!P1`, `UP0`), if any.
    pub pred: Option<String>,
    /// The full opcode with its modifiers (`HMMA.16816.F32.BF16`).
    pub opcode: String,
    /// A direct branch's target address (`BRA`, `BRA.DIV`, `JMP`).
    pub target: Option<u32>,
    /// A branch on a predicate operand (`BRA !P1, 0x1950`), guarded or not.
    pub on_operand: bool,
}

impl Instr {
    /// The opcode without modifiers (`HMMA`, `LDS`, `BRA`).
    pub fn base(&self) -> &str {
        self.opcode.split('.').next().unwrap_or("")
    }

    /// Whether the instruction never runs (`@!PT`: ptxas's padding).
    pub fn never(&self) -> bool {
        self.pred.as_deref() == Some("!PT")
    }

    /// Whether it runs only when a predicate or a condition holds. `BRA.DIV` and
    /// `BRA.CONV` branch on the warp's convergence, `BRA !P1, ...` on its operand, so they
    /// are conditional unguarded.
    pub fn conditional(&self) -> bool {
        let guarded = matches!(self.pred.as_deref(), Some(p) if p != "PT");
        guarded
            || self.on_operand
            || self
                .opcode
                .split('.')
                .skip(1)
                .any(|m| m == "DIV" || m == "CONV")
    }
}

/// What `-res-usage` reports for one kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Resources {
    pub registers: u32,
    /// Static shared memory per block (bytes); dynamic shared memory is set at launch.
    pub shared: u32,
    /// Local memory per thread (bytes): the stack frame, where spills go.
    pub local: u32,
}

/// One kernel of one architecture.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub instrs: Vec<Instr>,
    pub resources: Option<Resources>,
}

/// The kernels of one architecture's machine code.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cubin {
    pub arch: String,
    pub kernels: Vec<Kernel>,
}

impl Cubin {
    fn kernel(&mut self, name: &str) -> &mut Kernel {
        if let Some(i) = self.kernels.iter().position(|k| k.name == name) {
            return &mut self.kernels[i];
        }
        self.kernels.push(Kernel {
            name: name.to_string(),
            ..Default::default()
        });
        self.kernels.last_mut().expect("just pushed")
    }
}

/// `/*0a30*/` → 0xa30; anything else (an encoding comment `/* 0x... */`) → None.
fn address(line: &str) -> Option<(u32, &str)> {
    let rest = line.trim_start().strip_prefix("/*")?;
    let end = rest.find("*/")?;
    let hex = &rest[..end];
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((u32::from_str_radix(hex, 16).ok()?, &rest[end + 2..]))
}

fn hex(token: &str) -> Option<u32> {
    u32::from_str_radix(token.trim().strip_prefix("0x")?, 16).ok()
}

/// Parses the text after an address: `[@pred] OPCODE operands ;`.
fn instruction(addr: u32, text: &str) -> Option<Instr> {
    let text = text.split(';').next()?.trim();
    let mut words = text.split_whitespace();
    let mut first = words.next()?;
    let mut pred = None;
    if let Some(p) = first.strip_prefix('@') {
        pred = Some(p.to_string());
        first = words.next()?;
    }
    let opcode = first.to_string();
    let base = opcode.split('.').next().unwrap_or("");
    // The target is the last operand: `BRA 0x2c0`, `BRA.DIV ~URZ, 0x7570`.
    let branch = base == "BRA" || base == "JMP";
    let target = if branch {
        text.rsplit([' ', ',']).next().and_then(hex)
    } else {
        None
    };
    let on_operand = branch
        && words.any(|w| {
            let w = w.trim_end_matches(',');
            let p = w.trim_start_matches('!').trim_start_matches('U');
            p.len() > 1 && p.starts_with('P') && p[1..].bytes().all(|b| b.is_ascii_digit())
        });
    Some(Instr {
        addr,
        pred,
        opcode,
        target,
        on_operand,
    })
}

/// `REG:30 STACK:0 SHARED:0 LOCAL:0 ...`
fn resources(line: &str) -> Option<Resources> {
    let mut r = Resources::default();
    let mut seen = false;
    for field in line.split_whitespace() {
        let (key, value) = field.split_once(':')?;
        let value: u32 = value.parse().ok()?;
        match key {
            "REG" => {
                r.registers = value;
                seen = true;
            }
            "SHARED" => r.shared = value,
            "LOCAL" => r.local = value,
            _ => {}
        }
    }
    seen.then_some(r)
}

/// Parses a dump; architectures in the order they appear.
pub fn parse(text: &str) -> Vec<Cubin> {
    let mut cubins: Vec<Cubin> = Vec::new();
    // Inside a `Fatbin ptx code` section nothing is machine code.
    let mut in_elf = true;
    let mut current: Option<String> = None;
    let mut res_kernel: Option<String> = None;
    for line in text.lines() {
        let t = line.trim();
        if t == "Fatbin elf code:" {
            in_elf = true;
        } else if t == "Fatbin ptx code:" {
            in_elf = false;
        } else if let Some(arch) = t.strip_prefix("arch = ") {
            if in_elf {
                cubins.push(Cubin {
                    arch: arch.trim().to_string(),
                    kernels: Vec::new(),
                });
            }
        } else if let Some(arch) = t.strip_prefix("code for ") {
            // A cubin's dump has no `arch =` line before it.
            if cubins.last().is_none_or(|c| c.arch != arch.trim()) {
                cubins.push(Cubin {
                    arch: arch.trim().to_string(),
                    kernels: Vec::new(),
                });
            }
        } else if let Some(name) = t.strip_prefix("Function : ") {
            current = Some(name.trim().to_string());
            if let Some(c) = cubins.last_mut() {
                c.kernel(name.trim());
            }
        } else if let Some(name) = t
            .strip_prefix("Function ")
            .and_then(|n| n.strip_suffix(':'))
        {
            res_kernel = Some(name.trim().to_string());
        } else if t.starts_with("REG:") {
            if let (Some(name), Some(r), Some(c)) = (&res_kernel, resources(t), cubins.last_mut()) {
                c.kernel(name).resources = Some(r);
            }
        } else if let Some((addr, rest)) = address(line) {
            if !in_elf {
                continue;
            }
            if let (Some(name), Some(c), Some(i)) =
                (&current, cubins.last_mut(), instruction(addr, rest))
            {
                c.kernel(name).instrs.push(i);
            }
        }
    }
    cubins
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_instructions_predicates_and_targets() {
        let text = "\tcode for sm_90\n\t\tFunction : k\n\
            \t.headerflags\t@\"EF_CUDA_SM90\"\n\
            /*0000*/                   LDC R1, c[0x0][0x28] ;   /* 0x00000a00ff017b82 */\n\
            \x20                                                 /* 0x000fe20000000800 */\n\
            /*0010*/              @!P0 BRA 0x2c0 ;              /* 0x0000000000688947 */\n\
            /*0020*/                   BRA.DIV ~URZ, 0x7570 ;   /* 0x0 */\n\
            /*0030*/               @PT HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n\
            /*0040*/              @!PT LDS RZ, [RZ] ;\n\
            /*0050*/                   BRA !P1, 0x1950 ;\n\
            /*0060*/                   BRA 0x60;\n";
        let c = parse(text);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].arch, "sm_90");
        let k = &c[0].kernels[0];
        assert_eq!(k.name, "k");
        assert_eq!(k.instrs.len(), 7, "the encoding line is not an instruction");
        assert_eq!(k.instrs[1].target, Some(0x2c0));
        assert_eq!(k.instrs[1].pred.as_deref(), Some("!P0"));
        assert!(k.instrs[1].conditional());
        assert_eq!(k.instrs[2].target, Some(0x7570));
        assert!(k.instrs[2].conditional(), "BRA.DIV is conditional");
        assert_eq!(k.instrs[3].base(), "HMMA");
        assert!(!k.instrs[3].conditional(), "@PT always runs");
        assert!(k.instrs[4].never());
        assert_eq!(k.instrs[0].target, None);
        assert_eq!(k.instrs[5].target, Some(0x1950));
        assert!(k.instrs[5].conditional(), "a branch on a predicate operand");
        assert_eq!(k.instrs[6].target, Some(0x60));
        assert!(!k.instrs[6].conditional());
    }

    #[test]
    fn reads_a_fatbin_dump_with_resources_per_architecture() {
        let c = parse(include_str!("../fixtures/sass/fatbin_two_archs.txt"));
        let archs: Vec<&str> = c.iter().map(|c| c.arch.as_str()).collect();
        assert_eq!(
            archs,
            ["sm_90", "sm_80"],
            "the PTX section is no architecture"
        );
        let k = &c[0].kernels[1];
        assert_eq!(k.name, "softmax_forward");
        assert_eq!(
            k.resources,
            Some(Resources {
                registers: 30,
                shared: 1024,
                local: 8
            })
        );
        assert_eq!(k.instrs.len(), 3);
        assert_eq!(c[1].kernels[0].resources.map(|r| r.registers), Some(31));
        assert_eq!(c[1].kernels[0].instrs.len(), 2);
    }
}
