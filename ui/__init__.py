"""The Gradio dashboard: a websocket client of the backend, laid out as one column per sample."""
