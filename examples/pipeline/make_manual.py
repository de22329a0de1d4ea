"""Write a long technical manual (Markdown) to evaluate in stages: a made-up
microcontroller's reference manual, chapter by chapter, register by register, longer
than a small model's context. Deterministic: the same file every run.

    python examples/pipeline/make_manual.py OUT_DIR [--chapters N]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

PERIPHERALS = ["GPIO", "UART", "SPI", "I2C", "TIMER", "ADC", "DMA", "WDT", "RTC", "PWM"]
FIELDS = ["EN", "MODE", "IRQ", "DIV", "RST", "LOCK", "SEL", "STAT", "CLR", "POL"]


def register(rng: random.Random, name: str, offset: int) -> str:
    lines = [f"### {name} (offset 0x{offset:03X})", ""]
    lines.append(
        f"The {name} register controls part of the peripheral. It resets to"
        f" 0x{rng.randrange(1 << 16):04X}. Writes while LOCK is set are ignored."
    )
    lines.append("")
    bit = 0
    for field in rng.sample(FIELDS, 4):
        width = rng.choice([1, 2, 4])
        access = rng.choice(["RW", "RO", "W1C"])
        lines.append(f"- bits {bit + width - 1}:{bit} {field} ({access}): "
                     f"{'enables' if field == 'EN' else 'selects'} the {field.lower()} function.")
        bit += width
    lines.append("")
    lines.append(" ".join(["Software must wait for STAT before a second write."] * 6))
    return "\n".join(lines)


def manual(chapters: int) -> str:
    rng = random.Random(31)
    out = ["# HX-31 Microcontroller Reference Manual", "",
           "This manual describes every register of the HX-31."]
    for c, name in enumerate(PERIPHERALS[:chapters], 1):
        out += ["", f"## {c}. {name}", "", f"The {name} block has eight registers.", ""]
        for r in range(8):
            out += [register(rng, f"{name}_{FIELDS[r]}", r * 4), ""]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--chapters", type=int, default=len(PERIPHERALS))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "hx31-manual.md"
    path.write_text(manual(args.chapters), encoding="utf-8")
    print(path)


if __name__ == "__main__":
    main()
