"""`pycni-agent`'s --ipam-timeout (cni.agent.main.parse): the limit an IPAM the agent execs runs under
(cni.delegate.Bound), by default the kubelet's RunPodSandbox deadline at its default settings."""

from __future__ import annotations

import pytest

from cni.agent import main
from cni.agent.server import IPAM_TIMEOUT


def test_the_ipam_timeout_and_its_default() -> None:
    assert main.parse([]).ipam_timeout == IPAM_TIMEOUT == 240.0
    assert main.parse(["--ipam-timeout=0.5"]).ipam_timeout == 0.5


@pytest.mark.parametrize("bad", ["0", "-1", "inf", "nan", "soon"])
def test_an_ipam_timeout_that_is_no_positive_number_is_refused(bad: str, capsys: pytest.CaptureFixture[str]
                                                               ) -> None:  # fmt: skip
    with pytest.raises(SystemExit):
        main.parse([f"--ipam-timeout={bad}"])
    assert "is not a positive number of seconds" in capsys.readouterr().err
