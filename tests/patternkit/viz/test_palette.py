"""Colours: stable per name, and every text colour readable (WCAG AA) on every fill."""

from __future__ import annotations

import re

import pytest

from patternkit.viz.palette import (
    FILLS,
    OKABE_ITO,
    STATUS_COLORS,
    contrast_ratio,
    fill_color,
    text_color,
)


def test_contrast_ratio_follows_wcag():
    assert contrast_ratio("#000000", "#FFFFFF") == pytest.approx(21.0)
    assert contrast_ratio("#777777", "#777777") == pytest.approx(1.0)
    assert contrast_ratio("#E69F00", "#FFFFFF") == pytest.approx(2.25, abs=0.01)  # too light


@pytest.mark.parametrize("fill", FILLS)
def test_default_black_text_reads_at_aa_on_every_fill(fill):
    assert contrast_ratio("#000000", fill) >= 4.5


@pytest.mark.parametrize("color", sorted(set(STATUS_COLORS.values()) | set(OKABE_ITO)))
def test_status_and_match_text_is_darkened_until_it_reads_at_aa_on_every_fill(color):
    text = text_color(color)
    assert all(contrast_ratio(text, fill) >= 4.5 for fill in FILLS), text
    # the same hue: the channels keep their order
    def rgb(c):
        return [int(c[i:i + 2], 16) for i in (1, 3, 5)]
    assert sorted(range(3), key=lambda i: rgb(color)[i]) == \
        sorted(range(3), key=lambda i: rgb(text)[i])


def test_every_font_colour_in_a_diff_drawing_reads_at_aa_on_every_fill():
    import patternkit as pk
    from patternkit.models import seed_batchnorm
    from patternkit.patterns import LIBRARY
    from patternkit.viz import viz_diff

    before = seed_batchnorm()
    log = pk.RewriteLog()
    after = pk.rewrite(LIBRARY["batchnorm.collapse"], before, log=log)
    source = viz_diff(before, after, changes=log).source
    fonts = set(re.findall(r'fontcolor="(#[0-9A-Fa-f]{6})', source))
    assert fonts  # removed and added nodes have coloured text
    assert all(contrast_ratio(f, fill) >= 4.5 for f in fonts for fill in FILLS), fonts


def test_fill_colours_are_stable_per_name():
    assert fill_color("ccompiler") == fill_color("ccompiler") in FILLS


def test_text_colour_is_worked_out_once_per_colour():
    from patternkit.viz import palette

    palette.text_color.cache_clear()
    first = palette.text_color("#E69F00")
    assert palette.text_color("#E69F00") == first
    info = palette.text_color.cache_info()
    assert (info.misses, info.hits) == (1, 1)
