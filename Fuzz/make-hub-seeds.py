#!/usr/bin/env python3
"""Writes the hub target's seeds (Fuzz/seeds/hub): scripts of the call flows a fuzzer should start
from. A step is two bytes, an operation and an argument (`HubWorld.step`): the argument's low six
bits pick the device (mod 3: 0 alice/phone, 1 alice/laptop, 2 bob/phone), the call id (/ 3 mod 4)
and an invite's callee (/ 12 mod 3: 0 alice, 1 bob, 2 carol); its two high bits are flags (0x80:
an answer instead of an offer, held, busy, leave the room; 0x40: muted; both, for a recording step:
0x00 requested, 0x40 accepted, 0x80 declined, 0xC0 stopped)."""
import pathlib

CONNECT, DROP, INVITE, RINGING, ACCEPT, DECLINE, HANGUP, SIGNAL, UPDATE, STATE, TIME, ROOM, ACK, RECORD = range(14)
ALICE_PHONE, ALICE_LAPTOP, BOB_PHONE = 0, 1, 2


def arg(device, call=0, callee=0, high=0):
    return (device + 3 * call + 12 * callee) | high


SEEDS = {
    # alice calls bob, bob rings and accepts, they signal, bob drops and resumes, alice hangs up.
    "call-resume-hangup": [(CONNECT, arg(0)), (CONNECT, arg(1)), (CONNECT, arg(2)), (INVITE, arg(ALICE_PHONE, 0, 1)),
                           (RINGING, arg(BOB_PHONE, 0)), (ACCEPT, arg(BOB_PHONE, 0)), (SIGNAL, arg(ALICE_PHONE, 0)),
                           (SIGNAL, arg(BOB_PHONE, 0, high=0x80)), (DROP, arg(BOB_PHONE)), (TIME, 8), (CONNECT, arg(BOB_PHONE)),
                           (STATE, arg(BOB_PHONE, 0)), (HANGUP, arg(ALICE_PHONE, 0)), (STATE, arg(BOB_PHONE, 0)), (ACK, arg(BOB_PHONE))],
    # bob calls alice, who has two devices: the laptop declines, the phone accepts; a second call times out.
    "two-devices": [(CONNECT, arg(0)), (CONNECT, arg(1)), (CONNECT, arg(2)), (INVITE, arg(BOB_PHONE, 1, 0)),
                    (RINGING, arg(ALICE_PHONE, 1)), (RINGING, arg(ALICE_LAPTOP, 1)), (ACCEPT, arg(ALICE_LAPTOP, 1)),
                    (ACCEPT, arg(ALICE_PHONE, 1)), (UPDATE, arg(ALICE_LAPTOP, 1, high=0x40)), (HANGUP, arg(BOB_PHONE, 1)),
                    (INVITE, arg(BOB_PHONE, 2, 0)), (TIME, 255), (TIME, 255), (STATE, arg(BOB_PHONE, 2))],
    # a call to carol, who has no device, and a decline; then time passes.
    "decline-and-timeout": [(CONNECT, arg(0)), (CONNECT, arg(2)), (INVITE, arg(ALICE_PHONE, 0, 2)), (INVITE, arg(BOB_PHONE, 1, 0)),
                            (DECLINE, arg(ALICE_PHONE, 1)), (TIME, 200), (TIME, 200), (STATE, arg(ALICE_PHONE, 0))],
    # alice asks to record, bob refuses; she asks again, he agrees, drops and resumes, she stops; they hang up.
    "recording": [(CONNECT, arg(0)), (CONNECT, arg(2)), (INVITE, arg(ALICE_PHONE, 0, 1)), (ACCEPT, arg(BOB_PHONE, 0)),
                  (RECORD, arg(ALICE_PHONE, 0)), (RECORD, arg(BOB_PHONE, 0, high=0x80)), (RECORD, arg(ALICE_PHONE, 0)),
                  (RECORD, arg(ALICE_PHONE, 0, high=0x40)), (RECORD, arg(BOB_PHONE, 0, high=0x40)), (DROP, arg(BOB_PHONE)),
                  (CONNECT, arg(BOB_PHONE)), (RECORD, arg(ALICE_PHONE, 0, high=0xC0)), (RECORD, arg(ALICE_PHONE, 0)),
                  (RECORD, arg(BOB_PHONE, 0, high=0x40)), (HANGUP, arg(BOB_PHONE, 0))],
    # everyone joins and leaves rooms, and drops out of them.
    "rooms": [(CONNECT, arg(0)), (CONNECT, arg(1)), (CONNECT, arg(2)), (ROOM, 0), (ROOM, 1), (ROOM, 2), (DROP, arg(ALICE_LAPTOP)),
              (ROOM, 0x80), (TIME, 40)],
}

if __name__ == "__main__":
    folder = pathlib.Path(__file__).resolve().parent / "seeds" / "hub"
    folder.mkdir(parents=True, exist_ok=True)
    for name, steps in SEEDS.items():
        (folder / f"{name}.bin").write_bytes(bytes(b for step in steps for b in step))
        print(f"{folder / name}.bin: {len(steps)} steps")
