"""Fault injection's arithmetic: which fault belongs to which torchrun attempt."""

import pytest

from pipeline.errors import UserError
from pipeline.interrupts.faults import ENV, Fault, fault_from_env, parse_faults

CHAIN = "rank=1,point=start; rank=0,epoch=2,step=3,action=hold,release=/tmp/go"


def test_a_chain_is_one_fault_per_attempt_in_order():
    assert parse_faults(CHAIN) == [
        Fault(rank=1, point="start"),
        Fault(rank=0, epoch=2, step=3, action="hold", release="/tmp/go"),
    ]
    attempts = [
        fault_from_env({ENV: CHAIN, "TORCHELASTIC_RESTART_COUNT": str(n)}) for n in range(3)
    ]
    assert attempts == [*parse_faults(CHAIN), None]  # past the chain: undisturbed


def test_no_fault_set_means_none_on_every_attempt():
    assert parse_faults(None) == parse_faults("") == []
    assert fault_from_env({}) is None
    assert fault_from_env({"TORCHELASTIC_RESTART_COUNT": "1"}) is None


@pytest.mark.parametrize(
    "text,words",
    [
        ("rank=0;point=eval", "expected rank=R"),
        ("rank=0,point=later", "point 'later'"),
        ("rank=0,action=explode", "action 'explode'"),
        ("rank=zero", "expected integers"),
        ("rank", "key=value pairs"),
    ],
)
def test_a_bad_fault_names_the_variable(text, words):
    with pytest.raises(UserError, match=ENV) as error:
        parse_faults(text)
    assert words in str(error.value)
