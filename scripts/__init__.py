"""Scripts run from the repo root (`python -m scripts.screenshot`), and shell scripts that set machines up."""
