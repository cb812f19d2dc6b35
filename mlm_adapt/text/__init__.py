"""Text to model inputs, without torch: corpus files -> jieba words -> tokens with word ids -> blocks."""
