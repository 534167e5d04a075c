"""What else the model could have said at a token: the alternatives as the page lists them, and
the popup that lists them in the sample grid and the token tree, without I/O.

A chunk's logprob pieces may carry each token's alternatives (protocol `logprob_pieces`:
`[drawn, [[token, logprob], ...]]`); the page keeps a piece's first token's, as `listed` turns them:
`[drawn, [[token, p], ...]]`, p a probability. `POPUP_JS` is the one popup both components' scripts
include: it lists a token's alternatives with their probabilities as percentages, the drawn one
marked, each a button that branches on it; where a run has none it says why (`why_none`).
"""

from __future__ import annotations

import math
from typing import Any

PROBABILITY_DIGITS = 4
"""An alternative's probability as the page keeps it: to 0.01 %."""


def listed(entry: Any) -> list[Any] | None:
    """A token's alternatives as the page keeps them, `[drawn, [[token, p], ...]]`, from the frame's
    `[drawn, [[token, logprob], ...]]`; None where the entry is not that."""
    if not (isinstance(entry, list | tuple) and len(entry) == 2 and isinstance(entry[1], list | tuple)):
        return None
    drawn, top = entry
    shown = [
        [str(pair[0]), round(math.exp(min(float(pair[1]), 0.0)), PROBABILITY_DIGITS)]
        for pair in top
        if isinstance(pair, list | tuple) and len(pair) == 2 and isinstance(pair[1], int | float)
    ]
    return [drawn if isinstance(drawn, int) and -1 <= drawn < len(shown) else -1, shown]


def first_listed(pieces: Any) -> list[Any] | None:
    """The alternatives of a logprob piece's first token (`[text, [logprob, ...], [entry, ...]]`),
    as `listed`; None where the piece has none."""
    if isinstance(pieces, list | tuple) and len(pieces) > 2 and pieces[2]:
        return listed(pieces[2][0])
    return None


def chosen_among(alternatives: list[Any] | None, chosen: Any) -> str:
    """Why `chosen` cannot be branched on at a token with `alternatives` ("" where it can: it is one
    of the tokens the engine listed there), in the page's words."""
    if not isinstance(chosen, str) or not chosen:
        return f"{str(chosen)[:40]!r} is not a token"
    if alternatives is None:
        return "the engine listed no alternatives at that token"
    if chosen not in [token for token, _ in alternatives[1]]:
        return f"{chosen[:40]!r} is not one of the alternatives the engine gave at that token"
    return ""


def is_drawn(alternatives: list[Any] | None, chosen: str) -> bool:
    """Whether `chosen` is the token that was drawn there (branching on it is Continue from here)."""
    return alternatives is not None and alternatives[0] >= 0 and alternatives[1][alternatives[0]][0] == chosen


def why_none(engine: str) -> str:
    """What the popup says at a token of a run with token confidence but no alternatives."""
    if engine == "replay":
        return "this replay was saved without alternatives"
    return "this engine gives no alternatives"


CSS = """
.alt-popup { position: absolute; z-index: 5; min-width: 12em; max-width: 22em; font-size: 0.8em;
  background: var(--background-fill-primary, white); color: var(--body-text-color, #0f172a);
  border: 1px solid #7c3aed; border-radius: 6px; padding: 4px; box-shadow: 0 4px 14px rgba(0,0,0,0.18); }
.alt-popup .alt-head { color: var(--body-text-color-subdued, #64748b); padding: 1px 4px 3px; }
.alt-popup .alt-row { display: flex; width: 100%; gap: 8px; justify-content: space-between;
  font: inherit; text-align: left; background: none; color: inherit; border: 1px solid transparent;
  border-radius: 4px; padding: 1px 4px; cursor: pointer; }
.alt-popup .alt-row:hover:not(:disabled) { border-color: #7c3aed; }
.alt-popup .alt-row:disabled { cursor: default; opacity: 0.6; }
.alt-popup .alt-row.drawn { font-weight: 600; background: rgba(124, 58, 237, 0.12); }
.alt-popup .alt-token { white-space: pre; font-family: var(--font-mono, monospace); overflow: hidden;
  text-overflow: ellipsis; }
.alt-popup .alt-pct { font-variant-numeric: tabular-nums; }
"""
"""The popup: a small box of rows, the drawn one bold and tinted."""

POPUP_JS = r"""
// A token's alternatives in a popup (ui/alternatives_view.py): each row a token, its probability as
// a percentage and, for the token drawn, a mark; a row's click calls pick(token, drawn). Tokens go
// into text nodes (a token may be anything), spaces shown as they are in a monospace box.
function alternativesPopup(id, pick) {
  const popup = document.createElement('div');
  popup.className = 'alt-popup';
  popup.id = id;
  function shown(token) {
    return JSON.stringify(token).slice(1, -1);
  }
  function open(host, top, left, alts, note, whyNot) {
    popup.replaceChildren();
    const head = document.createElement('div');
    head.className = 'alt-head';
    popup.appendChild(head);
    if (!alts) {
      head.textContent = note || 'no alternatives at this token';
    } else {
      const [drawn, rows] = alts;
      head.textContent = whyNot ? `${rows.length} most likely here (to branch on one: ${whyNot})`
        : `${rows.length} most likely here: pick one to branch on it`;
      rows.forEach(([token, p], i) => {
        const row = document.createElement('button');
        row.className = 'alt-row' + (i === drawn ? ' drawn' : '');
        row.dataset.token = token;
        row.disabled = Boolean(whyNot);
        row.title = whyNot || (i === drawn ? 'the token drawn: continue from here'
                                           : 'branch: n new samples with this token instead');
        const text = document.createElement('span');
        text.className = 'alt-token';
        text.textContent = `"${shown(token)}"` + (i === drawn ? '  \u25c2 drawn' : '');
        const pct = document.createElement('span');
        pct.className = 'alt-pct';
        pct.textContent = `${(100 * p).toFixed(1)} %`;
        row.append(text, pct);
        row.addEventListener('click', (event) => {
          event.stopPropagation();
          if (row.disabled) return;
          popup.querySelectorAll('button').forEach((b) => { b.disabled = true; });
          pick(token, i === drawn);
        });
        popup.appendChild(row);
      });
      if (drawn < 0) {
        const out = document.createElement('div');
        out.className = 'alt-head';
        out.textContent = 'the token drawn is not among these';
        popup.appendChild(out);
      }
    }
    popup.style.top = `${top}px`;
    popup.style.left = `${left}px`;
    host.appendChild(popup);
  }
  return {element: popup, open, close: () => popup.remove()};
}
"""
