"""Text-to-speech (`task=tts`): Transformer-TTS on the LJSpeech layout (design TASKS.md)."""
